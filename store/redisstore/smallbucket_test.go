package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// TestSmallBucketWaitsForRedis: while the Store limits locally, a bucket
// whose headers named fewer requests per window than the local share
// waits for Redis (the processes, each limiting to its share, could meet
// in one window of it), and its claims go through Redis once it is back;
// a bucket as large as the share is limited locally as before.
func TestSmallBucketWaitsForRedis(t *testing.T) {
	srv := startServer(t)
	client := fastClient(t, srv.addr())
	prefix := testPrefix(t)
	s := redisstore.New(client, redisstore.WithPrefix(prefix), redisstore.WithLocalShare(4),
		redisstore.WithProbeInterval(50*time.Millisecond))
	t.Cleanup(func() { s.Close() })
	small := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}
	large := store.Claim{Credential: "bot", Route: "GET /channels/:id/messages", Major: "channels/1"}

	// learn has the route's headers name limit: a response of a window
	// that ends soon, so that the hold-off after the fallback is short.
	learn := func(c store.Claim, hash string, limit int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		r, err := s.Acquire(ctx, c)
		if err != nil {
			t.Fatalf("%s: %v", c.Route, err)
		}
		if err := r.Report(ctx, store.Update{Sent: true, Status: 200, Bucket: hash, HasLimit: true,
			Limit: limit, Remaining: limit - 1, ResetAfter: 50 * time.Millisecond}); err != nil {
			t.Fatalf("%s: report: %v", c.Route, err)
		}
		r.Recycle()
	}
	learn(small, "small", 1)
	learn(large, "large", 8)
	// Another process that never read a response of the route learns its
	// limit from Redis's refusal.
	other := redisstore.New(fastClient(t, srv.addr()), redisstore.WithPrefix(prefix), redisstore.WithLocalShare(4),
		redisstore.WithProbeInterval(time.Hour))
	t.Cleanup(func() { other.Close() })
	if _, err := other.Acquire(t.Context(), store.Claim{Credential: small.Credential, Route: small.Route,
		Major: small.Major, NoWait: true}); err == nil {
		t.Fatal("the other process's NoWait claim on the spent bucket of 1 was granted")
	}

	srv.stop()
	fallBack(t, s, "the Store", large)

	// The large bucket: granted locally (after the hold-off).
	grantedLocally(t, s, large, "claim on a bucket of 8 while limiting locally with a share of 4")

	// The small bucket: not granted while Redis is away.
	err := claimBriefly(s, small)
	var werr *store.WaitError
	if !errors.As(err, &werr) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim on a bucket of 1 while limiting locally with a share of 4 = %v; want a wait error at its deadline", err)
	}
	if _, err := s.Acquire(t.Context(), store.Claim{Credential: small.Credential, Route: small.Route, Major: small.Major,
		NoWait: true}); !errors.Is(err, store.ErrWaitTooLong) {
		t.Fatalf("NoWait claim on the small bucket while limiting locally = %v; want ErrWaitTooLong at once", err)
	}

	// The other process, limiting locally too, holds the bucket it knows
	// of only through Redis.
	fallBack(t, other, "the other Store", large)
	grantedLocally(t, other, large, "the other process's claim on a bucket it never saw, while limiting locally")
	if err := claimBriefly(other, small); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the other process's claim on the bucket of 1 it learned from Redis, while limiting locally = %v; want a wait error at its deadline", err)
	}

	if d, err := s.Estimate(t.Context(), small); err != nil || d != 50*time.Millisecond {
		t.Fatalf("Estimate of the small bucket while limiting locally = %v, %v; want the probe interval, 50ms", d, err)
	}

	// A claim that waits is granted through Redis once it is back.
	type result struct {
		r   *store.Reservation
		err error
	}
	done := make(chan result, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		r, err := s.Acquire(ctx, small)
		done <- result{r, err}
	}()
	select {
	case res := <-done:
		t.Fatalf("claim on the small bucket returned (%v) while Redis was away", res.err)
	case <-time.After(300 * time.Millisecond):
	}
	srv.start()
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatalf("claim on the small bucket after Redis came back: %v", res.err)
		}
		if s.Stats().Local {
			t.Error("granted while the Store still limits locally")
		}
		res.r.Cancel()
	case <-time.After(15 * time.Second):
		t.Fatal("claim on the small bucket still waits 15 s after Redis came back")
	}
}

// TestSmallBucketKnownWaitOutlivesRedis: a bucket too small to share
// waits for Redis while the Store limits locally, but a reset that Redis
// had already told this process of lasts whatever happens to Redis: a
// claim whose deadline comes first fails at once, as it would with Redis
// up, not when its deadline passes.
func TestSmallBucketKnownWaitOutlivesRedis(t *testing.T) {
	srv := startServer(t)
	s := redisstore.New(fastClient(t, srv.addr()), redisstore.WithPrefix(testPrefix(t)), redisstore.WithLocalShare(4),
		redisstore.WithProbeInterval(50*time.Millisecond))
	t.Cleanup(func() { s.Close() })
	small := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}
	large := store.Claim{Credential: "bot", Route: "GET /channels/:id/messages", Major: "channels/1"}
	r, err := s.Acquire(t.Context(), small)
	if err != nil {
		t.Fatal(err)
	}
	const reset = 10 * time.Second
	if err := r.Report(t.Context(), store.Update{Sent: true, Status: 200, Bucket: "small", HasLimit: true,
		Limit: 1, Remaining: 0, ResetAfter: reset}); err != nil {
		t.Fatal(err)
	}
	r.Recycle()
	subscribed(t, s)
	// Redis tells this process how long the bucket's wait lasts.
	if err := claimBriefly(s, small); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim on the spent bucket = %v; want a wait error", err)
	}

	srv.stop()
	fallBack(t, s, "the Store", large)
	start := time.Now()
	err = claimBriefly(s, small)
	elapsed := time.Since(start)
	var werr *store.WaitError
	if !errors.As(err, &werr) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("claim on the spent bucket of 1 while limiting locally = %v; want a wait error", err)
	}
	if elapsed >= 250*time.Millisecond {
		t.Errorf("claim with a 300 ms deadline on a bucket known to reset in %v failed after %v; want at once", reset, elapsed)
	}
	if werr.RetryAfter <= time.Second {
		t.Errorf("WaitError.RetryAfter = %v; want the known reset, about %v", werr.RetryAfter, reset)
	}
}

// grantedLocally fails t unless st grants c within 5 s (once the hold-off
// after its fallback has passed), and gives the grant back.
func grantedLocally(t *testing.T, st *redisstore.Store, c store.Claim, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	r, err := st.Acquire(ctx, c)
	if err != nil {
		t.Fatalf("%s: %v; want a local grant", what, err)
	}
	r.Cancel()
}

// claimBriefly claims c on st with a 300 ms deadline and returns the
// error (nil when granted, the grant given back).
func claimBriefly(st *redisstore.Store, c store.Claim) error {
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r, err := st.Acquire(ctx, c)
	if err == nil {
		r.Cancel()
	}
	return err
}

// fallBack claims c on st until st limits locally (a call finds the
// server gone), failing t after 10 s.
func fallBack(t *testing.T, st *redisstore.Store, name string, c store.Claim) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !st.Stats().Local; {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not fall back to local limiting within 10 s of the server's stop", name)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		if r, err := st.Acquire(ctx, c); err == nil {
			r.Cancel()
		}
		cancel()
	}
}
