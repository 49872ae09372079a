package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ratecord/ratecord/store"
)

var _ store.Estimator = (*Store)(nil)

// Estimate implements [store.Estimator]. When this process already knows
// that c's wait lasts until a moment (its queue's or the global window's
// last refusal named it), that is the answer, without a Redis command.
// Otherwise it asks Redis, in one read-only script call, how long c would
// wait if claimed now (the credential's pauses, its global window, the
// bucket's reset or drip, and the claims waiting ahead: this process's
// queue and the other processes' tickets), after this process's reports
// of the credential are applied. It takes no slot. While the Store limits
// locally it asks the local limiter, but for a bucket too small to share
// (see [WithLocalShare]), which waits for Redis: the probe interval, the
// soonest Redis can be found back. A refusal comes back as the
// *[store.WaitError] Acquire would return; a Redis failure as one
// wrapping [ErrUnavailable].
func (s *Store) Estimate(ctx context.Context, c store.Claim) (time.Duration, error) {
	if err := s.refuseInvalid(&c); err != nil {
		return 0, err
	}
	if err := s.refuseKnown(&c); err != nil {
		return 0, err
	}
	if s.degraded.Load() {
		if s.smallBucket(&c) {
			return s.probeEvery, nil
		}
		return s.local.Estimate(ctx, c)
	}
	now := time.Now()
	s.mu.Lock()
	ss := s.sessions[c.Credential]
	queued := 0
	var known time.Duration
	var target uint64
	if ss != nil {
		if q := ss.queues[qkey{route: c.Route, major: c.Major, kind: c.Kind}]; q != nil {
			queued = len(q.waiters)
			known = q.boundFrom(now)
		}
		if c.Global && ss.gateBound.After(now) {
			known = max(known, ss.gateBound.Sub(now))
		}
		if known == 0 && len(ss.reports) > 0 {
			// What this process reported is part of the answer: send it
			// now, and wait for it.
			target = ss.reports[len(ss.reports)-1].seq
			ss.flushAt = now
			ss.kick()
		}
	}
	guess := s.guess(c.Credential + "\x00" + c.Route)
	s.mu.Unlock()
	if known > 0 {
		return known, nil
	}
	if target > 0 {
		if err := s.awaitApplied(ctx, ss, target); err != nil {
			return 0, err
		}
		s.mu.Lock()
		guess = s.guess(c.Credential + "\x00" + c.Route)
		s.mu.Unlock()
	}

	k := s.keysOf(c.Credential)
	pid := probeID(c.Route, c.Major)
	for range 3 { // the route's hash may have changed since it was cached
		bid := guessedID(guess, c.Route, c.Major)
		keys := []string{k.routes(), k.cred(), k.global(), k.dead(c.Major), k.bucket(bid), k.bucket(pid),
			k.line(bid), k.tix(bid), k.line(globalLine), k.tix(globalLine), k.sublimit(digest(c.Route, c.Major, c.Kind))}
		args := []any{c.Route, guess, flag(c.Global), s.pol.Limit(&c), millis(s.pol.GlobalWindow),
			millis(s.pol.GlobalHold), flag(c.TokenAuth), queued, millis(store.ClampDuration(c.Spacing)), c.Kind, s.id, s.clockArg()}
		var reply any
		_, err := s.bounded(ctx, func(ctx context.Context) error {
			var err error
			reply, err = s.fcall(ctx, fnEstimate, keys, args...).Result()
			return err
		}, func() {})
		if err != nil {
			return 0, unavailable("estimate", err)
		}
		a, _ := reply.([]any)
		kind, err := replyInt(a, 0)
		if err != nil {
			return 0, err
		}
		switch kind {
		case 1:
			ms, err := replyInt(a, 1)
			if err != nil || ms < 0 {
				return 0, fmt.Errorf("%w: estimate %v", errReply, a)
			}
			return time.Duration(ms) * time.Millisecond, nil
		case 2:
			ms, err1 := replyInt(a, 1)
			why, err2 := replyInt(a, 2)
			if err1 != nil || err2 != nil || ms < 0 {
				return 0, fmt.Errorf("%w: estimate %v", errReply, a)
			}
			reason := store.ErrUnauthorized
			if why == 3 {
				reason = store.ErrWebhookGone
			}
			return 0, &store.WaitError{Scope: store.ScopeGuard, RetryAfter: time.Duration(ms) * time.Millisecond, Err: reason}
		case 3:
			h, ok := replyString(a, 1)
			if !ok {
				return 0, fmt.Errorf("%w: estimate %v", errReply, a)
			}
			guess = h
		default:
			return 0, fmt.Errorf("%w: estimate %v", errReply, a)
		}
	}
	return 0, fmt.Errorf("%w: estimate: the route's bucket kept changing", errReply)
}

// awaitApplied waits until Redis applied the reports of ss up to the
// number target, or a call fails, ctx ends or the Store closes.
func (s *Store) awaitApplied(ctx context.Context, ss *session, target uint64) error {
	s.mu.Lock()
	f0 := ss.failures
	for ss.applied < target {
		if ss.failures != f0 {
			s.mu.Unlock()
			return unavailable("estimate", errReportsNotWritten)
		}
		ch := ss.progress
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return &store.WaitError{Err: ctx.Err()}
		case <-s.done:
			return &store.WaitError{Err: store.ErrClosed}
		}
		s.mu.Lock()
	}
	s.mu.Unlock()
	return nil
}

// errReportsNotWritten reports that the reports an answer depends on
// could not be written.
var errReportsNotWritten = fmt.Errorf("redisstore: earlier reports not written")
