package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// TestFreezeIsNotAStall makes a call outlast the call timeout twice, the
// server held by DEBUG SLEEP both times: once while the Store's freeze
// watch has recorded that the process did not run for the whole call (as
// after SIGSTOP, when the reply waits in the socket), once without. The
// first is not a Redis stall: the call is given more time or made again,
// and no request goes to the local limiter, which knows nothing of the
// windows other processes fill through Redis. The second is a stall, and
// falls back.
func TestFreezeIsNotAStall(t *testing.T) {
	srv := startServer(t, "--enable-debug-command", "local")
	client := fastClient(t, srv.addr())
	s := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)), redisstore.WithCallTimeout(200*time.Millisecond))
	t.Cleanup(func() { s.Close() })
	c := store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/1"}
	p := acquire(t, s, c, 2*time.Second)
	p.Report(t.Context(), limitsOf(c, 50, 49, 10*time.Second))

	sleep := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			admin := redis.NewClient(&redis.Options{Addr: srv.addr(), ReadTimeout: 10 * time.Second})
			defer admin.Close()
			done <- admin.Do(context.Background(), "DEBUG", "SLEEP", "0.7").Err()
		}()
		time.Sleep(50 * time.Millisecond) // let DEBUG SLEEP begin
		return done
	}

	// Frozen: the watch says the process did not run from before the
	// call until after the server answers.
	slept := sleep()
	s.Froze(time.Now().Add(-10*time.Millisecond), time.Now().Add(time.Second))
	p = acquire(t, s, c, 5*time.Second)
	p.Report(t.Context(), limitsOf(c, 50, 48, 10*time.Second))
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	st := s.Stats()
	if st.Fallbacks != 0 || st.LocalGrants != 0 || st.Stalls != 0 {
		t.Errorf("Stats() after a call that spanned a freeze = %+v; want no stall, no fallback, no local grant", st)
	}
	if st.Descheduled == 0 {
		t.Errorf("Stats() after a call that spanned a freeze = %+v; want Descheduled counted", st)
	}

	// Running all along: the same wait is a stall.
	time.Sleep(1100 * time.Millisecond) // past the recorded freeze
	slept = sleep()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if p, err := s.Acquire(ctx, store.Claim{Credential: "cred", Route: "GET /guilds/:id", Major: "guilds/2"}); err == nil {
		p.Cancel()
	}
	if err := <-slept; err != nil {
		t.Fatalf("DEBUG SLEEP: %v", err)
	}
	if st := s.Stats(); st.Stalls == 0 || st.Fallbacks == 0 {
		t.Errorf("Stats() after a stall of a running process = %+v; want the stall counted and a fallback", st)
	}
}

// TestSlidingInFlightOfAStoppedProcess: a process that stops (SIGSTOP, a
// long pause) with requests in flight on a sliding bucket holds their
// slots whole only until they have surely reached Discord (the hold after
// their grant) and a running process would have reported them (the
// model's report slack after that). Then they drain for every other
// process, from the hold on, as answered ones would, although their
// responses are not reported until it runs again.
func TestSlidingInFlightOfAStoppedProcess(t *testing.T) {
	addr, prefix := redisAddr(t), testPrefix(t)
	stopped := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix))
	running := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix))
	t.Cleanup(func() { stopped.Close(); running.Close() })
	ctx := t.Context()
	c := store.Claim{Credential: "cred", Route: "POST /channels/:id/messages", Major: "channels/1"}

	// A bucket of 10 per second that drains one slot per 100 ms: each
	// response of a burst names a full-again moment 100 ms later.
	const limit, tau = 10, 100 * time.Millisecond
	report := func(p *store.Reservation, counted int) {
		t.Helper()
		u := store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true, Limit: limit, Remaining: limit - counted,
			ResetAfter: time.Duration(counted)*tau - 10*time.Millisecond}
		if err := p.Report(ctx, u); err != nil {
			t.Fatalf("Report: %v", err)
		}
	}
	report(acquire(t, stopped, c, 2*time.Second), 1)
	var burst []*store.Reservation
	for range limit - 1 {
		burst = append(burst, acquire(t, stopped, c, 2*time.Second))
	}
	for i, p := range burst {
		report(p, i+2)
	}
	time.Sleep(limit*tau + 200*time.Millisecond) // drained

	// The process fills the bucket, then stops: nothing more reported.
	var inFlight []*store.Reservation
	var last time.Time
	for range 2 * limit {
		wctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		p, err := stopped.Acquire(wctx, c)
		cancel()
		if err != nil {
			break
		}
		inFlight, last = append(inFlight, p), time.Now()
	}
	if len(inFlight) < limit/2 || len(inFlight) >= 2*limit {
		t.Fatalf("%d grants on a drained bucket of %d; want it filled, then a wait", len(inFlight), limit)
	}

	p := acquire(t, running, c, 5*time.Second)
	waited := time.Since(last)
	t.Logf("%d requests in flight; another process granted %v after the last", len(inFlight), waited)
	if waited < store.DefaultGlobalHold-50*time.Millisecond {
		t.Errorf("another process was granted %v after the bucket filled; want no sooner than the hold (%v): the requests in flight may not have arrived before", waited, store.DefaultGlobalHold)
	}
	report(p, limit)
	for _, p := range inFlight {
		report(p, limit)
	}
}
