package memstore

import (
	"context"

	"github.com/ratecord/ratecord/store"
)

// subKey names a hidden sublimit: the requests of one kind (see
// [store.Claim].Kind) on a route and major parameter.
type subKey struct {
	route, major, kind string
}

// maxSubs bounds the hidden sublimits kept per credential. Beyond it, a
// sublimit's 429 pauses its whole bucket, as a 429 of the bucket does.
const maxSubs = 1024

// sublimit returns until when a hidden sublimit holds claim c at now, or 0.
func (cr *cred) sublimit(c *store.Claim, now int64) int64 {
	if c.Kind == "" || len(cr.subs) == 0 {
		return 0
	}
	if until := cr.subs[subKey{c.Route, c.Major, c.Kind}]; until > now {
		return until
	}
	return 0
}

// holdSublimit holds the requests of c's kind until until, and reports
// whether it could: the credential keeps at most maxSubs sublimits.
func (cr *cred) holdSublimit(c *store.Claim, now, until int64) bool {
	k := subKey{c.Route, c.Major, c.Kind}
	if _, ok := cr.subs[k]; !ok && len(cr.subs) >= maxSubs {
		cr.sweepSubs(now)
		if len(cr.subs) >= maxSubs {
			return false
		}
	}
	if cr.subs == nil {
		cr.subs = make(map[subKey]int64)
	}
	cr.subs[k] = max(cr.subs[k], until)
	return true
}

// sweepSubs forgets the sublimits that ended by now.
func (cr *cred) sweepSubs(now int64) {
	for k, until := range cr.subs {
		if until <= now {
			delete(cr.subs, k)
		}
	}
	if len(cr.subs) == 0 {
		cr.subs = nil
	}
}

// awaitSublimit waits while a hidden sublimit holds c. Such a claim waits
// apart from its bucket's queue, so the bucket's other requests keep
// flowing; once the sublimit ends it queues as any claim does. The wait
// counts against c.MaxWait.
func (s *Store) awaitSublimit(ctx context.Context, c *store.Claim) error {
	if c.Kind == "" {
		return nil
	}
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return &store.WaitError{Err: store.ErrClosed}
		}
		start := s.clock.Now()
		now := s.ms(start)
		var until int64
		if cr := s.creds[c.Credential]; cr != nil {
			until = cr.sublimit(c, now)
		}
		s.mu.Unlock()
		if until == 0 {
			return nil
		}
		d := ms(until - now)
		if err := store.CheckWait(ctx, c, start, d); err != nil {
			return &store.WaitError{Scope: store.ScopeUser, RetryAfter: d, Err: err}
		}
		t := s.clock.NewTimer(d)
		var err error
		select {
		case <-t.C():
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.Done:
			err = store.ErrClosed
		case <-s.done:
			err = store.ErrClosed
		}
		t.Stop()
		if err != nil {
			return &store.WaitError{Scope: store.ScopeUser, RetryAfter: d, Err: err}
		}
		if c.MaxWait > 0 {
			// The wait for the bucket that follows may last what is left.
			c.MaxWait -= s.clock.Now().Sub(start)
			if c.MaxWait <= 0 {
				return &store.WaitError{Scope: store.ScopeUser, Err: store.ErrWaitTooLong}
			}
		}
	}
}
