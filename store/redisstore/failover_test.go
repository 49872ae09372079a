package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// syncBuffer is a bytes.Buffer safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func fastClient(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr: addr, DialTimeout: 200 * time.Millisecond,
		ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetries: 1,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

func limitsOf(c store.Claim, limit, remaining int, reset time.Duration) store.Update {
	return store.Update{
		Sent: true, Status: 200, Bucket: "h", HasLimit: true, Limit: limit, Remaining: remaining, ResetAfter: reset,
	}
}

func acquire(t *testing.T, s store.Store, c store.Claim, within time.Duration) *store.Reservation {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	p, err := s.Acquire(ctx, c)
	if err != nil {
		t.Fatalf("Acquire(%s) = %v; want a permit within %v", c.Route, err, within)
	}
	return p
}

// TestFailOpen stops the server in the middle of the test: requests keep
// being granted by the local limiter, waiters queued at the time are not
// dropped, and the store returns to Redis by itself when it is back.
func TestFailOpen(t *testing.T) {
	srv := startServer(t)
	client := fastClient(t, srv.addr())
	var logs syncBuffer
	var seen atomic.Int32
	prefix := testPrefix(t)
	s := redisstore.New(client,
		redisstore.WithPrefix(prefix),
		redisstore.WithProbeInterval(50*time.Millisecond),
		redisstore.WithLocalShare(2),
		redisstore.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		redisstore.WithOnFallback(func(error) { seen.Add(1) }),
	)
	t.Cleanup(func() { s.Close() })

	c := store.Claim{Credential: "cred", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true}
	// A bucket of 2, no smaller than the local share (a smaller one waits
	// for Redis: TestSmallBucketWaitsForRedis).
	if err := acquire(t, s, c, time.Second).Report(t.Context(), limitsOf(c, 2, 0, 700*time.Millisecond)); err != nil {
		t.Fatalf("Update = %v", err)
	}
	// A waiter queued on the exhausted bucket when the server goes away.
	queued := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		p, err := s.Acquire(ctx, c)
		if err == nil {
			err = p.Report(ctx, limitsOf(c, 2, 0, 50*time.Millisecond))
		}
		queued <- err
	}()
	time.Sleep(50 * time.Millisecond)
	srv.stop()

	// Permits granted through Redis before the outage are still answered;
	// their Update reports the outage.
	if err := <-queued; err != nil {
		t.Fatalf("waiter queued when Redis went away: %v; want a permit from the local limiter", err)
	}
	if st := s.Stats(); !st.Local || st.Fallbacks != 1 || seen.Load() != 1 {
		t.Errorf("Stats() = %+v, fallback callbacks %d; want local mode after one fallback", st, seen.Load())
	}
	if !strings.Contains(logs.String(), "limiting locally") {
		t.Errorf("log = %q; want the fallback logged", logs.String())
	}
	for i := range 3 {
		p := acquire(t, s, c, 3*time.Second)
		if err := p.Report(t.Context(), limitsOf(c, 10, 9-i, 50*time.Millisecond)); err != nil {
			t.Fatalf("Update of a local permit = %v; want nil", err)
		}
	}

	srv.start()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Local {
		if time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v 10s after Redis came back; want the store back on Redis", s.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st := s.Stats(); st.Recoveries != 1 {
		t.Errorf("Stats().Recoveries = %d; want 1", st.Recoveries)
	}
	p := acquire(t, s, c, 3*time.Second)
	if err := p.Report(t.Context(), limitsOf(c, 10, 9, time.Second)); err != nil {
		t.Fatalf("Update after recovery = %v", err)
	}
	keys, err := client.Keys(t.Context(), prefix+":*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("KEYS %s:* = %v, %v; want the state back in Redis", prefix, keys, err)
	}
}

// TestFailClosed stops the server: Acquire fails with ErrUnavailable, then
// works again once the server is back.
func TestFailClosed(t *testing.T) {
	srv := startServer(t)
	client := fastClient(t, srv.addr())
	s := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)), redisstore.WithFailurePolicy(redisstore.FailClosed))
	t.Cleanup(func() { s.Close() })
	c := store.Claim{Credential: "cred", Route: "GET /users/@me"}
	p := acquire(t, s, c, time.Second)

	srv.stop()
	// Update never waits for Redis: the update stays queued until the
	// server is back.
	if err := p.Report(t.Context(), limitsOf(c, 5, 4, time.Second)); err != nil {
		t.Errorf("Update with Redis down = %v; want nil (queued)", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err := s.Acquire(ctx, store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/1"})
	var we *store.WaitError
	if !errors.Is(err, redisstore.ErrUnavailable) || !errors.As(err, &we) {
		t.Fatalf("Acquire with Redis down = %v; want a *store.WaitError wrapping ErrUnavailable", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Acquire with Redis down waited for the deadline; want it to fail at once")
	}
	if s.Stats().Local {
		t.Errorf("Stats().Local = true under FailClosed")
	}

	srv.start()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		p, err := s.Acquire(ctx, store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/2"})
		cancel()
		if err == nil {
			if err := p.Report(t.Context(), limitsOf(c, 5, 4, time.Second)); err != nil {
				t.Fatalf("Update after restart = %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Acquire 10s after the restart = %v; want a permit", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for st := s.Stats(); st.Queued != 0 || st.Dropped != 0; st = s.Stats() {
		if st.Dropped != 0 || time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v after the restart; want every update written", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLocalWaiterAfterRecovery: a request that queued in the local
// limiter during an outage and is granted there after Redis came back is
// claimed through Redis as well: the other processes, back on Redis, must
// see it in the windows they fill. (Waiters granted on the local limiter
// alone after a restart once sent a whole global window over the limit,
// seconds after Redis was back.)
func TestLocalWaiterAfterRecovery(t *testing.T) {
	srv := startServer(t)
	client := fastClient(t, srv.addr())
	s := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)),
		redisstore.WithProbeInterval(50*time.Millisecond), redisstore.WithLocalShare(1))
	t.Cleanup(func() { s.Close() })

	c := store.Claim{Credential: "cred", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true}
	acquire(t, s, c, time.Second).Report(t.Context(), limitsOf(c, 1, 0, 300*time.Millisecond))
	srv.stop()
	// Through the local limiter: it learns the bucket spent for 1.5 s.
	acquire(t, s, c, 5*time.Second).Report(t.Context(), limitsOf(c, 1, 0, 1500*time.Millisecond))
	if st := s.Stats(); !st.Local || st.LocalGrants != 1 {
		t.Fatalf("Stats() = %+v; want local mode, one local grant", st)
	}
	// A waiter queues in the local limiter; Redis comes back meanwhile.
	got := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		p, err := s.Acquire(ctx, c)
		if err == nil {
			err = p.Report(ctx, limitsOf(c, 1, 0, time.Second))
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	srv.start()
	deadline := time.Now().Add(10 * time.Second)
	for s.Stats().Local {
		if time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v 10s after Redis came back; want the store back on Redis", s.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := <-got; err != nil {
		t.Fatalf("waiter queued in the local limiter: %v; want a grant", err)
	}
	if st := s.Stats(); st.LocalGrants != 1 {
		t.Errorf("Stats().LocalGrants = %d after the waiter was granted with Redis back; want 1 (it claimed through Redis too)", st.LocalGrants)
	}
	if n, err := client.Keys(t.Context(), "*:g").Result(); err != nil || len(n) == 0 {
		t.Errorf("global window keys in Redis = %v, %v; want the waiter's slot counted there", n, err)
	}
}

// TestOutageResponsesReachRedis: a response a process read while it
// limited locally goes to Redis once Redis is back, so that the other
// processes learn the window it dates. (After a restart, an empty Redis
// once granted another process a request into a window that a request
// sent during the outage had spent.)
func TestOutageResponsesReachRedis(t *testing.T) {
	srv := startServer(t)
	prefix := testPrefix(t)
	a := redisstore.New(fastClient(t, srv.addr()), redisstore.WithPrefix(prefix),
		redisstore.WithProbeInterval(50*time.Millisecond), redisstore.WithLocalShare(1))
	t.Cleanup(func() { a.Close() })

	c := store.Claim{Credential: "cred", Route: "POST /channels/:id/messages", Major: "channels/1"}
	acquire(t, a, c, time.Second).Report(t.Context(), limitsOf(c, 1, 0, 200*time.Millisecond))
	srv.stop()
	// Through the local limiter, once the window has passed: the response
	// says the bucket is spent for 3 s.
	acquire(t, a, c, 5*time.Second).Report(t.Context(), limitsOf(c, 1, 0, 3*time.Second))
	if st := a.Stats(); !st.Local || st.LocalGrants != 1 {
		t.Fatalf("Stats() = %+v; want local mode, one local grant", st)
	}
	srv.start() // empty
	deadline := time.Now().Add(10 * time.Second)
	for a.Stats().Local || a.Stats().Queued > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("Stats() = %+v 10s after Redis came back; want the store back on Redis, its outbox sent", a.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Another process, which never limited locally, learns the window from
	// Redis.
	b := redisstore.New(fastClient(t, srv.addr()), redisstore.WithPrefix(prefix))
	t.Cleanup(func() { b.Close() })
	c.MaxWait = 100 * time.Millisecond
	_, err := b.Acquire(t.Context(), c)
	var we *store.WaitError
	if !errors.As(err, &we) || we.RetryAfter < time.Second {
		t.Fatalf("Acquire in another process after the restart = %v; want a wait of about 3 s from the response read during the outage", err)
	}
}
