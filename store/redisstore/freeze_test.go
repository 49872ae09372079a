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
