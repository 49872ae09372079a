package discordtest

import (
	"math"
	"time"
)

// limits is the real size of a counter: Limit requests per window, the window
// already multiplied by the time scale.
type limits struct {
	limit  int
	window time.Duration
}

// state is what a counter announces in the rate-limit headers.
type state struct {
	remaining  int
	resetAfter time.Duration
}

// counter counts requests against limits. Every rate limit of the emulator is
// a counter in one map, keyed by counterKey: buckets, the global limit, shared
// resources, the hidden sublimit and invalid requests. A counter is not safe
// for concurrent use; the server's mutex guards all of them.
//
// limits are passed on every call rather than stored, so a live change of a
// bucket applies to its existing counters at once.
type counter interface {
	// check reports whether one more request fits at now and, when it does
	// not, how long until it does.
	check(now time.Time, l limits) (ok bool, wait time.Duration)
	// add counts one request at now.
	add(now time.Time, l limits)
	// state returns the remaining requests and the time until the counter
	// has fully reset.
	state(now time.Time, l limits) state
	// idle reports whether the counter has fully reset, so dropping it
	// changes nothing.
	idle(now time.Time, l limits) bool
}

// take counts one request if it fits.
func take(c counter, now time.Time, l limits) (ok bool, wait time.Duration) {
	ok, wait = c.check(now, l)
	if ok {
		c.add(now, l)
	}
	return ok, wait
}

// fixedWindow is a window that opens at the first request, counts up to the
// limit and resets all at once when the window has passed.
type fixedWindow struct {
	start time.Time // first request of the current window
	count int       // requests in the current window
}

func (f *fixedWindow) expired(now time.Time, l limits) bool {
	return f.count == 0 || !now.Before(f.start.Add(l.window))
}

func (f *fixedWindow) check(now time.Time, l limits) (bool, time.Duration) {
	if f.expired(now, l) {
		return l.limit > 0, l.window
	}
	if f.count < l.limit {
		return true, 0
	}
	return false, f.start.Add(l.window).Sub(now)
}

func (f *fixedWindow) add(now time.Time, l limits) {
	if f.expired(now, l) {
		f.start, f.count = now, 0
	}
	f.count++
}

func (f *fixedWindow) state(now time.Time, l limits) state {
	if f.expired(now, l) {
		return state{remaining: l.limit}
	}
	return state{remaining: max(0, l.limit-f.count), resetAfter: f.start.Add(l.window).Sub(now)}
}

func (f *fixedWindow) idle(now time.Time, l limits) bool { return f.expired(now, l) }

// epsilon absorbs floating-point error in slidingWindow levels.
const epsilon = 1e-6

// slidingWindow is a leaky bucket of capacity limit draining continuously at
// limit per window: a request fits when the level plus one does not exceed
// the limit, so slots come back one at a time.
type slidingWindow struct {
	level float64   // requests in the bucket at last
	last  time.Time // when level was computed
}

// drain lowers the level by what leaked out since last.
func (s *slidingWindow) drain(now time.Time, l limits) {
	if !now.After(s.last) {
		return
	}
	if s.level > 0 && l.limit > 0 && l.window > 0 {
		s.level -= now.Sub(s.last).Seconds() * float64(l.limit) / l.window.Seconds()
		if s.level < epsilon {
			s.level = 0
		}
	}
	s.last = now
}

// slotTime is how long slots take to drain, to the nearest nanosecond so
// floating-point error does not show in millisecond headers.
func slotTime(l limits, slots float64) time.Duration {
	return time.Duration(math.Round(slots * float64(l.window) / float64(l.limit)))
}

func (s *slidingWindow) check(now time.Time, l limits) (bool, time.Duration) {
	if l.limit <= 0 {
		return false, l.window
	}
	s.drain(now, l)
	over := s.level + 1 - float64(l.limit)
	if over <= epsilon {
		return true, 0
	}
	return false, slotTime(l, over)
}

func (s *slidingWindow) add(now time.Time, l limits) {
	s.drain(now, l)
	s.level++
}

func (s *slidingWindow) state(now time.Time, l limits) state {
	if l.limit <= 0 {
		return state{}
	}
	s.drain(now, l)
	rem := int(math.Floor(float64(l.limit) - s.level + epsilon))
	return state{remaining: max(0, rem), resetAfter: slotTime(l, s.level)}
}

func (s *slidingWindow) idle(now time.Time, l limits) bool {
	s.drain(now, l)
	return s.level == 0
}

// slidingLog counts the requests of the last window exactly: at most limit
// requests in any window. It backs the global limit ("50 requests in any
// second") and the invalid-request count. It keeps at most limit+1 times.
type slidingLog struct {
	times []time.Time // ascending; only times within the window after prune
}

// prune drops times that have left the window ending at now.
func (g *slidingLog) prune(now time.Time, l limits) {
	cut := now.Add(-l.window)
	i := 0
	for i < len(g.times) && !g.times[i].After(cut) {
		i++
	}
	g.times = g.times[i:]
}

func (g *slidingLog) check(now time.Time, l limits) (bool, time.Duration) {
	g.prune(now, l)
	if len(g.times) < l.limit {
		return true, 0
	}
	if l.limit <= 0 {
		return false, l.window
	}
	// Once the oldest len-limit+1 entries leave, one more fits.
	return false, g.times[len(g.times)-l.limit].Add(l.window).Sub(now)
}

func (g *slidingLog) add(now time.Time, l limits) {
	g.prune(now, l)
	g.times = append(g.times, now)
	if n := len(g.times) - (l.limit + 1); n > 0 {
		g.times = g.times[n:]
	}
}

// count returns the number of requests in the window ending at now.
func (g *slidingLog) count(now time.Time, l limits) int {
	g.prune(now, l)
	return len(g.times)
}

func (g *slidingLog) state(now time.Time, l limits) state {
	g.prune(now, l)
	st := state{remaining: max(0, l.limit-len(g.times))}
	if len(g.times) > 0 {
		st.resetAfter = g.times[len(g.times)-1].Add(l.window).Sub(now)
	}
	return st
}

func (g *slidingLog) idle(now time.Time, l limits) bool {
	g.prune(now, l)
	return len(g.times) == 0
}
