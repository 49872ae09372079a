package memstore

import (
	"context"
	"time"

	"github.com/ratecord/ratecord/store"
)

// subKey names a hidden sublimit: the requests of one kind (see
// [store.Claim].Kind) on a route and major parameter.
type subKey struct {
	route, major, kind string
}

// sublimit is what a hidden sublimit's 429 taught: its requests wait until
// until; then, as long again (until end), they go one at a time in arrival
// order, so that the ones that waited do not all meet the sublimit again
// at once.
type sublimit struct {
	until, end int64
	busy       bool          // a request of the kind is out, sent after until
	line       []*subWaiter  // the claims waiting for their turn, in arrival order
	changed    chan struct{} // closed, and replaced, when busy or line changes
}

// subWaiter is a claim in a sublimit's line.
type subWaiter struct{ seq uint64 }

// signal wakes the claims waiting for a change of e.
func (e *sublimit) signal() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// leave takes w out of e's line.
func (e *sublimit) leave(w *subWaiter) {
	for i, x := range e.line {
		if x == w {
			e.line = append(e.line[:i], e.line[i+1:]...)
			e.signal()
			return
		}
	}
}

// maxSubs bounds the hidden sublimits kept per credential. Beyond it, a
// sublimit's 429 pauses its whole bucket, as a 429 of the bucket does.
const maxSubs = 1024

func subKeyOf(c *store.Claim) subKey { return subKey{c.Route, c.Major, c.Kind} }

// sublimitWait returns until when a hidden sublimit holds claim c at now,
// or 0 (a lower bound when a request of its kind is out).
func (cr *cred) sublimitWait(c *store.Claim, now int64) int64 {
	if c.Kind == "" || len(cr.subs) == 0 {
		return 0
	}
	if e := cr.subs[subKeyOf(c)]; e != nil && e.until > now {
		return e.until
	}
	return 0
}

// holdSublimit holds the requests of c's kind for retry from now, and
// reports whether it could: the credential keeps at most maxSubs
// sublimits.
func (cr *cred) holdSublimit(c *store.Claim, now, retry int64) bool {
	k := subKeyOf(c)
	e := cr.subs[k]
	if e == nil {
		if len(cr.subs) >= maxSubs {
			cr.sweepSubs(now)
			if len(cr.subs) >= maxSubs {
				return false
			}
		}
		if cr.subs == nil {
			cr.subs = make(map[subKey]*sublimit)
		}
		e = &sublimit{changed: make(chan struct{})}
		cr.subs[k] = e
	}
	e.until = max(e.until, now+retry)
	e.end = max(e.end, e.until+retry)
	return true
}

// releaseSublimit ends the turn of the request of c's kind that was out.
func (cr *cred) releaseSublimit(c *store.Claim) {
	if c.Kind == "" {
		return
	}
	if e := cr.subs[subKeyOf(c)]; e != nil && e.busy {
		e.busy = false
		e.signal()
	}
}

// sweepSubs forgets the sublimits that ended by now.
func (cr *cred) sweepSubs(now int64) {
	for k, e := range cr.subs {
		if now >= e.end && !e.busy && len(e.line) == 0 {
			delete(cr.subs, k)
		}
	}
	if len(cr.subs) == 0 {
		cr.subs = nil
	}
}

// awaitSublimit waits while a hidden sublimit holds c, and reports whether
// c took the sublimit's turn (see sublimit), which its settlement, or
// releaseSublimit when it is not granted, gives back. Such a claim waits
// apart from its bucket's queue, so the bucket's other requests keep
// flowing; it then queues as any claim does. The wait counts against
// c.MaxWait.
func (s *Store) awaitSublimit(ctx context.Context, c *store.Claim) (turn bool, err error) {
	if c.Kind == "" {
		return false, nil
	}
	var me *subWaiter
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return false, &store.WaitError{Err: store.ErrClosed}
		}
		start := s.clock.Now()
		now := s.ms(start)
		var e *sublimit
		if cr := s.creds[c.Credential]; cr != nil {
			e = cr.subs[subKeyOf(c)]
		}
		if e == nil || me == nil && now >= e.end && !e.busy && len(e.line) == 0 {
			s.mu.Unlock()
			return false, nil
		}
		if me == nil {
			s.seq++
			me = &subWaiter{seq: s.seq}
			e.line = append(e.line, me)
		}
		d := ms(e.until - now)
		if now >= e.until {
			if !e.busy && e.line[0] == me {
				e.busy = true
				e.leave(me) // signals the others: the turn is taken
				s.mu.Unlock()
				return true, nil
			}
			d = 0 // until the turn comes: only a response or a leaving claim ends it
		}
		changed := e.changed
		s.mu.Unlock()

		err := store.CheckWait(ctx, c, start, d)
		if err == nil && c.NoWait {
			err = store.ErrWaitTooLong
		}
		var t interface{ Stop() bool }
		var timer <-chan time.Time
		if err == nil {
			if d > 0 {
				tm := s.clock.NewTimer(d)
				t, timer = tm, tm.C()
			}
			select {
			case <-timer:
			case <-changed:
			case <-ctx.Done():
				err = ctx.Err()
			case <-c.Done:
				err = store.ErrClosed
			case <-s.done:
				err = store.ErrClosed
			}
			if t != nil {
				t.Stop()
			}
		}
		if err == nil && c.MaxWait > 0 {
			// The wait for the bucket that follows may last what is left.
			if c.MaxWait -= s.clock.Now().Sub(start); c.MaxWait <= 0 {
				err = store.ErrWaitTooLong
			}
		}
		if err != nil {
			s.mu.Lock()
			e.leave(me)
			s.mu.Unlock()
			return false, &store.WaitError{Scope: store.ScopeUser, RetryAfter: d, Err: err}
		}
	}
}
