package redisstore

import (
	"sync"
	"sync/atomic"
	"time"
)

// A process that does not run for a while (stopped by SIGSTOP or a
// debugger, starved by a CPU quota, paused by its VM) sees every call that
// spanned the pause take as long as the pause, although Redis may have
// answered at once: the reply waits in the socket. Taken for a Redis stall,
// such a call would switch the Store to its local limiter, which knows
// nothing of the windows that the other processes fill through Redis.
//
// A freezeWatch tells the two apart. A ticker measures how late it runs:
// a tick later than freezeSlack after it was due shows a span in which
// this process did not run. A call is a Redis stall only when it has had
// the call timeout of time in which the process ran; a call that failed
// for want of it is made again, not taken for an outage.
//
// The ticker runs while the Store makes calls (it stops after
// freezeIdle without one): a hundred wake-ups a second, a few microseconds
// of CPU each.

const (
	// freezeTick is how often the watch ticks.
	freezeTick = 10 * time.Millisecond
	// freezeSlack is how late a tick may run before the span counts as
	// a freeze: scheduling jitter on a busy host stays below it.
	freezeSlack = 20 * time.Millisecond
	// freezeIdle stops the ticker when no call asked for it that long.
	freezeIdle = 10 * time.Second
	// maxFreezeExtension bounds how long a call may go on past the call
	// timeout because the process froze during it.
	maxFreezeExtension = 10 * time.Second
	// freezeGaps is how many recent freezes the watch remembers.
	freezeGaps = 16
)

// freezeWatch measures the spans in which the process did not run. Times
// are monotonic nanoseconds since base. Its methods are safe for
// concurrent use.
type freezeWatch struct {
	base time.Time
	now  func() time.Time // time.Now, or a test's

	running atomic.Bool
	used    atomic.Int64 // when a call last asked (ns since base)

	mu   sync.Mutex
	last int64 // the last tick (ns since base); 0 while stopped
	gaps [freezeGaps]span
	next int // where the next gap goes in gaps
}

// span is [from, to) in nanoseconds since base.
type span struct{ from, to int64 }

func newFreezeWatch(now func() time.Time) *freezeWatch {
	if now == nil {
		now = time.Now
	}
	return &freezeWatch{base: now(), now: now}
}

func (w *freezeWatch) ns(t time.Time) int64 { return int64(t.Sub(w.base)) }

// touch notes that a call is starting. It reports whether the ticker was
// stopped: the caller must then run [freezeWatch.run] on a goroutine.
func (w *freezeWatch) touch() bool {
	now := w.ns(w.now())
	w.used.Store(now)
	if w.running.Load() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.running.Load() {
		return false
	}
	w.running.Store(true)
	w.last = now
	return true
}

// run ticks until stop is closed, or until no call has asked for the watch
// for freezeIdle.
func (w *freezeWatch) run(stop <-chan struct{}) {
	t := time.NewTicker(freezeTick)
	defer t.Stop()
	for {
		select {
		case <-stop:
			w.halt(func() bool { return true })
			return
		case <-t.C:
		}
		now := w.ns(w.now())
		w.tick(now)
		if w.halt(func() bool { return now-w.used.Load() > int64(freezeIdle) }) {
			return
		}
	}
}

// halt marks the ticker stopped when done reports true, under w.mu so that
// a touch either sees it running or starts it again; it reports done's
// answer.
func (w *freezeWatch) halt(done func() bool) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !done() {
		return false
	}
	w.running.Store(false)
	w.last = 0
	return true
}

// tick records a tick at now: a tick later than freezeSlack after the
// previous one was due records the span in between as a freeze.
func (w *freezeWatch) tick(now int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last != 0 && now-w.last > int64(freezeTick+freezeSlack) {
		w.gaps[w.next] = span{w.last + int64(freezeTick), now}
		w.next = (w.next + 1) % freezeGaps
	}
	w.last = now
}

// frozen returns how long the process did not run between from and to, as
// far as the watch saw: the freezes it recorded, and the one it is in the
// middle of when its ticker has not run since it was due (the process
// has just woken, and this goroutine ran first).
func (w *freezeWatch) frozen(from, to time.Time) time.Duration {
	f, t := w.ns(from), w.ns(to)
	if t <= f {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	var d int64
	for _, g := range w.gaps {
		d += overlap(g, f, t)
	}
	if now := w.ns(w.now()); w.last != 0 && now-w.last > int64(freezeTick+freezeSlack) {
		d += overlap(span{w.last + int64(freezeTick), now}, f, t)
	}
	return time.Duration(d)
}

func overlap(g span, from, to int64) int64 {
	lo, hi := max(g.from, from), min(g.to, to)
	return max(hi-lo, 0)
}

// liveLeft returns how much longer a call begun at start, whose timeout
// is timeout, should be given at now because the process did not run for
// part of it: the timeout less the time the process ran since start, when
// it froze for more than freezeSlack of it; 0 when the call has had its
// time, or its extension is used up.
func (w *freezeWatch) liveLeft(start, now time.Time, timeout time.Duration) time.Duration {
	fz := w.frozen(start, now)
	if fz <= freezeSlack || now.Sub(start) >= timeout+maxFreezeExtension {
		return 0
	}
	ran := now.Sub(start) - fz
	return max(timeout-ran, 0)
}
