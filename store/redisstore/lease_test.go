package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/internal/rediscount"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// leaseStore returns a store over a client whose commands are counted.
func leaseStore(t *testing.T, opts ...redisstore.Option) (*redisstore.Store, *rediscount.Hook) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddr(t)})
	t.Cleanup(func() { c.Close() })
	hook := &rediscount.Hook{}
	c.AddHook(hook)
	s := redisstore.New(c, append([]redisstore.Option{redisstore.WithPrefix(testPrefix(t))}, opts...)...)
	t.Cleanup(func() { s.Close() })
	return s, hook
}

// TestLeaseSavesRoundTrips sends requests one after the other on a bucket
// with plenty left: the claims lend slots to the next requests, so most
// requests cost no Redis command of their own.
func TestLeaseSavesRoundTrips(t *testing.T) {
	run := func(t *testing.T, opts ...redisstore.Option) int64 {
		s, hook := leaseStore(t, opts...)
		ctx := t.Context()
		c := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true, GlobalLimit: 1 << 20}
		const n = 400
		for i := range n {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			p, err := s.Acquire(ctx, c)
			cancel()
			if err != nil {
				t.Fatalf("request %d: Acquire = %v", i, err)
			}
			if err := p.Report(t.Context(), limitsOf(c, 1<<20, 1<<19, time.Hour)); err != nil {
				t.Fatalf("request %d: Update = %v", i, err)
			}
		}
		return hook.Commands.Load()
	}
	without := run(t, redisstore.WithLease(0))
	with := run(t)
	t.Logf("400 requests: %d commands without leases, %d with", without, with)
	if with*3 > without {
		t.Errorf("with leases %d commands for 400 requests; want under a third of the %d without", with, without)
	}
}

// TestLeaseRevokedBy429 checks that a 429 on a queue with a lease gives the
// lease back: the next request waits for the pause instead of taking a
// lent slot.
func TestLeaseRevokedBy429(t *testing.T) {
	s, _ := leaseStore(t)
	ctx := t.Context()
	c := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}
	acquire := func(maxWait time.Duration) (*store.Reservation, error) {
		cl := c
		cl.MaxWait = maxWait
		return s.Acquire(ctx, cl)
	}
	var last *store.Reservation
	for i := range 30 {
		p, err := acquire(time.Second)
		if err != nil {
			t.Fatalf("request %d: Acquire = %v", i, err)
		}
		if i == 29 {
			last = p
			break
		}
		p.Report(ctx, limitsOf(c, 1000, 900, time.Hour))
	}
	u := limitsOf(c, 1000, 900, time.Hour)
	u.Status, u.Scope, u.RetryAfter = 429, store.ScopeShared, 2*time.Second
	last.Report(ctx, u)
	if p, err := acquire(200 * time.Millisecond); err == nil {
		t.Fatalf("Acquire after a shared 429 of 2 s granted %+v; want it to wait for the pause", p)
	} else if !errors.Is(err, store.ErrWaitTooLong) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire after a shared 429 = %v; want a wait error", err)
	}
}
