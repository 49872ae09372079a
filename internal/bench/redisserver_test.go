package bench

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func needRedisServer(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("redis-server is not installed")
	}
}

// TestRedisServerRestartsEmpty: the bench's own server answers on a
// loopback port, is gone once killed, and comes back on the same port
// without the keys it had.
func TestRedisServerRestartsEmpty(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	srv, err := StartRedis(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if !strings.HasPrefix(srv.Addr, "127.0.0.1:") {
		t.Errorf("server on %s; want a loopback address", srv.Addr)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	defer c.Close()
	ctx := t.Context()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Error("the killed server answers")
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Errorf("EXISTS k after the restart = %d, %v; want 0: an empty server", n, err)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Error("the closed server answers")
	}
}

func TestOutageRunLength(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ d, down, want time.Duration }{
		{3 * time.Second, 3 * time.Second, 12 * time.Second},
		{20 * time.Second, 3 * time.Second, 20 * time.Second},
		{time.Second, time.Second, 9 * time.Second},
	} {
		if got := (&RedisOutage{Down: tt.down}).runLength(tt.d); got != tt.want {
			t.Errorf("runLength(%v) with an outage of %v = %v; want %v", tt.d, tt.down, got, tt.want)
		}
	}
	if got := (*RedisOutage)(nil).runLength(3 * time.Second); got != 3*time.Second {
		t.Errorf("runLength without an outage = %v; want 3s", got)
	}
}

// TestOutageTiming: the server is killed a third of the way into the run
// and answers again the outage's length later, inside the run.
func TestOutageTiming(t *testing.T) {
	t.Parallel()
	needRedisServer(t)
	srv, err := StartRedis(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	o := &RedisOutage{Server: srv, Down: 300 * time.Millisecond}
	start, d := time.Now(), 900*time.Millisecond
	run, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	rec, err := o.cause(t.Context(), run, start, d)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Restarts != 1 {
		t.Fatalf("restarts = %d; want 1", rec.Restarts)
	}
	if k := rec.Killed.Sub(start); k < d/3 || k > d/3+100*time.Millisecond {
		t.Errorf("killed %v into the run; want %v", k, d/3)
	}
	if b := rec.Back.Sub(rec.Killed); b < o.Down || b > o.Down+time.Second {
		t.Errorf("back %v after the kill; want %v", b, o.Down)
	}
	if err := (&RedisConfig{Addr: srv.Addr}).Ping(t.Context()); err != nil {
		t.Errorf("the server does not answer after the outage: %v", err)
	}
	// A run that ends before its third kills nothing.
	ended, cancel2 := context.WithCancel(t.Context())
	cancel2()
	if rec, err := o.cause(t.Context(), ended, time.Now(), time.Minute); err != nil || rec.Restarts != 0 {
		t.Errorf("outage of an ended run = %+v, %v; want none", rec, err)
	}
}

// TestMainRedisRestart runs the CLI with -redis-restart: the table counts
// the restart of the run and says what it was, and the server it started
// is gone once it returned.
func TestMainRedisRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("a run of 9 s")
	}
	t.Parallel()
	needRedisServer(t)
	var out bytes.Buffer
	err := Main(t.Context(), []string{"-redis-restart", "1s", "-scenario", "shared-hash", "-limiters", NameRedis}, &out, &out)
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"redis restarts", "killed (SIGKILL) a third of the way", "runs last at least 9s", "1 Redis restarts"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
	i := strings.Index(s, "redis-server (127.0.0.1:")
	if i < 0 {
		t.Fatalf("output names no server:\n%s", s)
	}
	addr := s[i+len("redis-server (") : i+strings.IndexByte(s[i:], ',')]
	if err := (&RedisConfig{Addr: addr}).Ping(t.Context()); err == nil {
		t.Errorf("the server on %s still answers after Main returned", addr)
	}
}
