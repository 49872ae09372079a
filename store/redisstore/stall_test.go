package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// TestOutboxKeepsUpdates stops the server: updates of permits granted
// through Redis are accepted at once, the oldest beyond the outbox limit
// are dropped and counted, and the rest are written once the server is
// back.
func TestOutboxKeepsUpdates(t *testing.T) {
	srv := startServer(t)
	client := fastClient(t, srv.addr())
	s := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)), redisstore.WithFailurePolicy(redisstore.FailClosed),
		redisstore.WithOutboxLimit(3))
	t.Cleanup(func() { s.Close() })

	const n = 5
	var permits []*store.Reservation
	var claims []store.Claim
	for i := range n {
		c := store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/" + string(rune('1'+i))}
		permits = append(permits, acquire(t, s, c, time.Second))
		claims = append(claims, c)
	}
	srv.stop()
	for i, p := range permits {
		if err := p.Report(t.Context(), limitsOf(claims[i], 5, 4, time.Second)); err != nil {
			t.Fatalf("Update %d with Redis down = %v; want nil", i, err)
		}
	}
	if st := s.Stats(); st.Dropped != n-3 || st.Queued > 3 {
		t.Errorf("Stats() = %+v with Redis down; want %d updates dropped, at most 3 queued", st, n-3)
	}

	srv.start()
	deadline := time.Now().Add(10 * time.Second)
	for st := s.Stats(); st.Queued > 0; st = s.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v 10s after the restart; want the outbox written", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The updates written count: the guilds whose update was written know
	// their bucket again, and grant.
	p := acquire(t, s, claims[n-1], 5*time.Second)
	if err := p.Report(t.Context(), limitsOf(claims[n-1], 5, 3, time.Second)); err != nil {
		t.Fatalf("Update after the restart = %v", err)
	}
}

// TestStallFailClosed stalls the server under fail-closed: a waiter gets
// ErrUnavailable instead of waiting for the server (or its own deadline),
// and an Update returns at once.
func TestStallFailClosed(t *testing.T) {
	srv := startServer(t, "--enable-debug-command", "local")
	client := redis.NewClient(&redis.Options{Addr: srv.addr()}) // go-redis' defaults: a 5 s read timeout
	t.Cleanup(func() { client.Close() })
	s := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)), redisstore.WithFailurePolicy(redisstore.FailClosed),
		redisstore.WithCallTimeout(200*time.Millisecond))
	t.Cleanup(func() { s.Close() })
	c := store.Claim{Credential: "cred", Route: "GET /users/@me"}
	p := acquire(t, s, c, time.Second)

	stalled := make(chan error, 1)
	go func() {
		admin := redis.NewClient(&redis.Options{Addr: srv.addr(), ReadTimeout: 10 * time.Second})
		defer admin.Close()
		stalled <- admin.Do(context.Background(), "DEBUG", "SLEEP", "2").Err()
	}()
	time.Sleep(100 * time.Millisecond) // let DEBUG SLEEP begin

	if err := p.Report(t.Context(), limitsOf(c, 5, 4, time.Second)); err != nil {
		t.Errorf("Update with Redis stalled = %v; want nil (queued)", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := s.Acquire(ctx, store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/1"})
	var we *store.WaitError
	if !errors.Is(err, redisstore.ErrUnavailable) || !errors.As(err, &we) {
		t.Errorf("Acquire with Redis stalled = %v; want a *store.WaitError wrapping ErrUnavailable", err)
	}
	if err := <-stalled; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	if st := s.Stats(); st.Stalls == 0 {
		t.Errorf("Stats() = %+v; want the stall counted", st)
	}
	// Back to normal once the server answers.
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		p, err := s.Acquire(ctx, store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/2"})
		cancel()
		if err == nil {
			if err := p.Report(t.Context(), limitsOf(c, 5, 4, time.Second)); err != nil {
				t.Fatalf("Update after the stall = %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire 10s after the stall = %v; want a permit", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
