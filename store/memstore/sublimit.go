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

// sublimit is the line of the requests of one kind (see [store.Claim].Kind)
// on a route and major parameter, and what a hidden sublimit's 429 taught:
// its requests wait until until. They always go one at a time, in arrival
// order: a kind has a hidden sublimit, so the next request of it leaves
// only once the response of the one before says whether the sublimit was
// met. No two requests of the kind are ever in flight when its 429 comes,
// and none overtakes one that waited. The kinds are rare edits (two
// renames per ten minutes are allowed), so this costs nothing a bot could
// use. An entry lives while a request of its kind waits or is out, and
// until end after a 429 (until, and as long again).
type sublimit struct {
	until, end int64
	busy       bool          // a request of the kind is out: the turn is taken
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

// sub returns the entry of c's kind, made when there is none, or nil when
// the credential keeps maxSubs entries already.
func (cr *cred) sub(c *store.Claim, now int64) *sublimit {
	k := subKeyOf(c)
	if e := cr.subs[k]; e != nil {
		return e
	}
	if len(cr.subs) >= maxSubs {
		cr.sweepSubs(now)
		if len(cr.subs) >= maxSubs {
			return nil
		}
	}
	if cr.subs == nil {
		cr.subs = make(map[subKey]*sublimit)
	}
	e := &sublimit{changed: make(chan struct{})}
	cr.subs[k] = e
	return e
}

// holdSublimit holds the requests of c's kind for retry from now, and
// reports whether it could: the credential keeps at most maxSubs
// sublimits.
func (cr *cred) holdSublimit(c *store.Claim, now, retry int64) bool {
	e := cr.sub(c, now)
	if e == nil {
		return false
	}
	e.until = max(e.until, now+retry)
	e.end = max(e.end, e.until+retry)
	return true
}

// releaseSublimit ends the turn of the request of c's kind that was out.
func (cr *cred) releaseSublimit(c *store.Claim, now int64) {
	if c.Kind == "" {
		return
	}
	k := subKeyOf(c)
	if e := cr.subs[k]; e != nil && e.busy {
		e.busy = false
		e.signal()
		cr.dropSub(k, e, now)
	}
}

// dropSub forgets e, the entry of k, once nothing waits on it, nothing of
// its kind is out and no 429 holds it.
func (cr *cred) dropSub(k subKey, e *sublimit, now int64) {
	if now >= e.end && !e.busy && len(e.line) == 0 && cr.subs[k] == e {
		delete(cr.subs, k)
		if len(cr.subs) == 0 {
			cr.subs = nil
		}
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

// awaitSublimit waits for the turn of c's kind (see sublimit), and reports
// whether c took it: its settlement, or releaseSublimit when it is not
// granted, gives it back. A claim without a kind, or whose credential
// keeps maxSubs entries already, takes no turn. A claim waits for its turn
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
		e := s.cred(c.Credential, now).sub(c, now)
		if e == nil {
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
			if cr := s.creds[c.Credential]; cr != nil {
				cr.dropSub(subKeyOf(c), e, s.now())
			}
			s.mu.Unlock()
			return false, &store.WaitError{Scope: store.ScopeUser, RetryAfter: d, Err: err}
		}
	}
}
