package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/ratecord/ratecord/store"
)

var _ store.Estimator = (*Store)(nil)

// Estimate implements [store.Estimator]: it asks Redis, in one read-only
// script call, how long c would wait if claimed now (the credential's
// pauses, its global window, the bucket's reset or drip, and the claims
// waiting ahead: this process's queue and the other processes' tickets).
// It takes no slot. While the Store limits locally it asks the local
// limiter. A refusal comes back as the *[store.WaitError] Acquire would
// return; a Redis failure as one wrapping [ErrUnavailable].
func (s *Store) Estimate(ctx context.Context, c store.Claim) (time.Duration, error) {
	if err := s.refuseInvalid(&c); err != nil {
		return 0, err
	}
	if err := s.refuseKnown(&c); err != nil {
		return 0, err
	}
	if s.degraded.Load() {
		return s.local.Estimate(ctx, c)
	}
	// What this process reported is part of the answer: let the writer
	// send it now rather than after its flush delay, and wait for it.
	s.out.mu.Lock()
	_, pending := s.out.last[c.Credential]
	s.out.mu.Unlock()
	if pending {
		poke(s.out.urgent)
	}
	if _, ok := s.synced(c.Credential); !ok {
		return 0, unavailable("estimate", errOutbox)
	}
	s.mu.Lock()
	guess := s.guesses[c.Credential+"\x00"+c.Route]
	queued := 0
	if q := s.queues[qkey{cred: c.Credential, route: c.Route, major: c.Major, kind: c.Kind}]; q != nil {
		queued = len(q.waiters)
	}
	s.mu.Unlock()

	k := s.keysOf(c.Credential)
	pid := probeID(c.Route, c.Major)
	for range 3 { // the route's hash may have changed since it was cached
		bid := guessedID(guess, c.Route, c.Major)
		keys := []string{k.routes(), k.cred(), k.global(), k.dead(c.Major), k.bucket(bid), k.bucket(pid), k.tickets(bid), k.sublimit(c.Route, c.Major, c.Kind)}
		args := []any{c.Route, guess, flag(c.Global), s.pol.Limit(&c), millis(s.pol.GlobalWindow),
			millis(s.pol.GlobalHold), flag(c.TokenAuth), queued, millis(store.ClampDuration(c.Spacing)), c.Kind, s.clockArg()}
		var reply any
		_, err := s.bounded(ctx, func(ctx context.Context) error {
			var err error
			reply, err = estimateScript.Run(ctx, s.client, keys, args...).Result()
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
			if len(a) < 2 {
				return 0, fmt.Errorf("%w: estimate %v", errReply, a)
			}
			guess, _ = a[1].(string)
		default:
			return 0, fmt.Errorf("%w: estimate %v", errReply, a)
		}
	}
	return 0, fmt.Errorf("%w: estimate: the route's bucket kept changing", errReply)
}
