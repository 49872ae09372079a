package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
)

// errStalled reports a Redis call that did not answer within the call
// timeout ([WithCallTimeout]).
var errStalled = errors.New("redisstore: no answer within the call timeout")

// unavailable wraps the cause of a failed Redis call for a waiter.
func unavailable(what string, err error) *store.WaitError {
	return &store.WaitError{Err: fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)}
}

// errDescheduled marks the error of a call that failed because this
// process did not run for part of it (see freeze.go), not because Redis
// did not answer: it is made again, not taken for an outage.
var errDescheduled = errors.New("redisstore: the process did not run during the call")

// bounded runs f with a context that ends after the call timeout; f's
// Redis calls end then when the client honours context deadlines (go-redis'
// ContextTimeoutEnabled). Whether or not it does, stalled is called once the
// timeout has passed with f still running, on a timer's goroutine while f
// goes on, so that the failure policy applies on time even with a client
// that waits out longer socket timeouts and retries. Time in which this
// process did not run does not count (see freeze.go): the timer waits
// until the call has had the call timeout of running time, and an error
// of f that the missing time explains (a timeout, a connection lost) is
// returned wrapped in errDescheduled. bounded returns once both f and
// stalled (if called) have returned; it reports whether stalled was
// called, and f's error.
func (s *Store) bounded(parent context.Context, f func(ctx context.Context) error, stalled func()) (bool, error) {
	s.watchFreezes()
	start := time.Now()
	ctx, cancel := context.WithTimeout(parent, s.callTimeout)
	defer cancel()
	var (
		mu        sync.Mutex // orders the timer's function after t is set and against f's return
		t         *time.Timer
		returned  bool
		isStalled bool
		done      = make(chan struct{})
	)
	mu.Lock()
	t = time.AfterFunc(s.callTimeout, func() {
		mu.Lock()
		if returned {
			mu.Unlock()
			return
		}
		if left := s.freezes.liveLeft(start, time.Now(), s.callTimeout); left > 0 {
			// The process did not run for part of the call: the reply
			// may be waiting. Give Redis the rest of its time.
			s.descheduled.Add(1)
			t.Reset(left)
			mu.Unlock()
			return
		}
		isStalled = true
		mu.Unlock()
		defer close(done)
		s.stalls.Add(1)
		stalled()
	})
	mu.Unlock()
	err := f(ctx)
	mu.Lock()
	returned = true
	st := isStalled
	mu.Unlock()
	t.Stop()
	if st {
		<-done
		return true, err
	}
	if err != nil && !answered(err) && parent.Err() == nil {
		if fz := s.freezes.frozen(start, time.Now()); fz > freezeSlack && time.Since(start)-fz < s.callTimeout {
			s.descheduled.Add(1)
			err = fmt.Errorf("%w (%v of %v): %w", errDescheduled, fz.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), err)
		}
	}
	return false, err
}

// watchFreezes starts the freeze watch's ticker if it is not running.
func (s *Store) watchFreezes() {
	if !s.freezes.touch() {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.freezes.run(s.done)
	}()
}

// call runs f for the driver of ss within the call timeout. When Redis
// does not answer in time, the failure policy applies at once, while f may
// go on: under [FailOpen] the Store falls back to its local limiter
// (failed hands every waiter over); under [FailClosed] the waiters of ss
// fail with [ErrUnavailable], and so do the new ones until f returns.
func (s *Store) call(ss *session, f func(ctx context.Context) error) (bool, error) {
	stalled, err := s.bounded(s.ctx, f, func() {
		s.stalled.Add(1)
		s.failed(errStalled)
		if s.policy != FailClosed {
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, q := range ss.queues {
			for _, w := range q.waiters {
				w.err = unavailable("claim", errStalled)
				q.settle(w, failed)
			}
			clear(q.waiters)
			q.waiters = q.waiters[:0]
		}
	})
	if stalled {
		s.stalled.Add(-1)
	}
	return stalled, err
}

const (
	// maxHold bounds the windows that the hold-off after a fallback and the
	// grace period after a recovery cover.
	maxHold = time.Minute
	// graceMargin is added to the hold-off and the grace period.
	graceMargin = 250 * time.Millisecond
)

// noteWindow records how long the window or pause that u reports may stay
// open, up to maxHold, for the hold-off and the grace period, and the
// limit its headers name (see smallBucket), and returns the longest such
// window recorded for c's route (0: none); s.mu must be held.
func (s *Store) noteWindow(c *store.Claim, u *store.Update) time.Duration {
	key := c.Credential + "\x00" + c.Route
	f, _ := s.routes.get(key)
	changed := u.HasLimit && f.setLimit(int64(u.Limit))
	if d := max(u.ResetAfter, u.RetryAfter); d > 0 {
		d = min(store.ClampDuration(d)+s.pol.ResetOffset, maxHold)
		if d > f.window {
			f.window, changed = d, true
			s.longest = max(s.longest, d)
		}
	}
	if changed {
		s.routes.put(key, f)
		s.remember()
	}
	return f.window
}

// noteLimit records limit, a limit Redis holds for a bucket of the route
// named by key (credential NUL route; 0: none known), as its responses'
// headers would have: a process that never read a response of the route
// knows it too (see smallBucket); s.mu must be held.
func (s *Store) noteLimit(key string, limit int64) {
	if limit <= 0 {
		return
	}
	if f, _ := s.routes.get(key); f.setLimit(limit) {
		s.routes.put(key, f)
		s.remember()
	}
}

// globalSpan is how long a global slot may count against the global
// window: the window, plus the time by which the request may reach
// Discord after its grant.
func (s *Store) globalSpan() time.Duration {
	return min(s.pol.GlobalWindow+s.pol.GlobalHold, maxHold)
}

// holdOff waits after a fallback until every window that grants made
// through Redis may have opened for c has closed: the global window when c
// counts against it, and the longest window or pause this Store saw on c's
// route (on any route when it saw none on this one), counted from the
// fallback, plus c's offset and a margin. The local limiter knows nothing of the slots that other
// processes took through Redis: without this wait it would add its share
// to windows they filled.
func (s *Store) holdOff(ctx context.Context, c *store.Claim) error {
	s.mu.Lock()
	fell := s.fellAt
	f, _ := s.routes.peek(c.Credential + "\x00" + c.Route)
	w := f.window
	if w == 0 {
		w = s.longest
	}
	s.mu.Unlock()
	if c.Global {
		w = max(w, s.globalSpan())
	}
	// A request granted through Redis just before the fallback may reach
	// Discord up to the claim's offset later, and later still on a busy
	// host: add the offset and a margin.
	w += s.pol.GlobalHold + graceMargin
	now := time.Now()
	until := fell.Add(w)
	if fell.IsZero() || !until.After(now) {
		return nil
	}
	d := until.Sub(now)
	// Every waiter of the route wakes at once: one whose deadline leaves
	// no time to reach Discord (the claim's offset) fails now, rather than
	// take a slot its request may use on its way out, and hand the next
	// one over when it fails.
	if err := store.CheckWait(ctx, c, now, d+s.pol.GlobalHold); err != nil {
		return &store.WaitError{RetryAfter: d, Err: err}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.Done:
		err = store.ErrClosed
	case <-s.done:
		err = store.ErrClosed
	}
	return &store.WaitError{RetryAfter: time.Until(until), Err: err}
}

// inGrace reports whether the Store is in the grace period that follows a
// return to Redis, during which a request needs a grant of the local
// limiter as well; s.mu must be held.
func (s *Store) inGrace(now time.Time) bool {
	return now.Before(s.graceUntil)
}

// recovered switches the Store back to Redis with a grace period long
// enough for every process to have recovered (one probe interval and one
// call timeout) and for every window opened by a local limiter to have
// closed (the longest window seen, up to maxHold); s.mu must be held.
func (s *Store) recovered(now time.Time) {
	w := max(s.longest, s.span)
	s.graceUntil = now.Add(s.probeEvery + s.callTimeout + w + graceMargin)
	s.probing = false
	s.degraded.Store(false)
	if s.back != nil {
		close(s.back)
		s.back = nil
	}
}

// giveBackLocal returns a local permit nobody will use.
func (s *Store) giveBackLocal(p *store.Reservation) {
	if p != nil {
		p.Cancel()
	}
}

// answered reports whether a failed call is known not to have run: Redis
// answered with an error, or the connection was never made. Otherwise (a
// timeout, a connection lost) the command may have reached Redis, which
// runs it when it can, even after a stall.
func answered(err error) bool {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return true
	}
	var oerr *net.OpError
	return errors.As(err, &oerr) && oerr.Op == "dial"
}

// failed counts a Redis error and applies the failure policy to the Store
// as a whole. Under [FailOpen] it switches to the local limiter and hands
// it every waiter at once: their drivers may still be inside a Redis call
// that stalls.
func (s *Store) failed(err error) {
	s.errs.Add(1)
	if s.policy != FailOpen || errors.Is(err, context.Canceled) && s.ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	if s.degraded.Load() {
		s.mu.Unlock()
		return
	}
	s.fellAt = time.Now()
	s.graceUntil = time.Time{}
	s.back = make(chan struct{})
	s.degraded.Store(true)
	for _, ss := range s.sessions {
		s.handOver(ss)
		ss.kick()
	}
	if !s.probing && !s.closed {
		s.probing = true
		s.wg.Add(1)
		go s.probe()
	}
	s.mu.Unlock()
	s.fallbacks.Add(1)
	s.log.LogAttrs(context.Background(), slogWarn, "ratecord: redis unavailable, limiting locally",
		attrErr(err), attrShare(s.share))
	if s.onFallback != nil {
		s.onFallback(err)
	}
}

// permanent reports whether err is an error reply that sending the same
// command again would not change; connection errors, timeouts and the
// replies of a server that is loading, busy or failing over are not.
func permanent(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, redis.Nil) {
		return false
	}
	for _, p := range []string{"NOSCRIPT", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "MOVED", "ASK"} {
		if strings.HasPrefix(rerr.Error(), p) {
			return false
		}
	}
	return true
}
