package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/ratecord/ratecord/store/redisstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// unavailable skips t, or fails it when the environment variable CI is
// "true": there, a missing Redis is a broken setup, not a reason to skip.
func unavailable(t testing.TB, why string) {
	t.Helper()
	msg := "no Redis for this test: set REDIS_ADDR to a server's address, or put redis-server on PATH (" + why + ")"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// server is a redis-server process started by a test on a loopback port.
type server struct {
	t    testing.TB
	port int
	dir  string
	args []string
	cmd  *exec.Cmd
}

func (s *server) addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// freePort returns a loopback port nobody listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on a free loopback port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startServer starts a redis-server with no persistence on a free loopback
// port, killed when t ends. It skips t when redis-server is not on PATH.
func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		unavailable(t, "redis-server not found on PATH")
	}
	s := &server{t: t, port: freePort(t), dir: t.TempDir(), args: extra}
	s.start()
	t.Cleanup(s.stop)
	return s
}

// start runs the server (again) on its port and waits until it answers.
func (s *server) start() {
	s.t.Helper()
	args := append([]string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--protected-mode", "no", "--loglevel", "warning",
	}, s.args...)
	s.cmd = exec.Command("redis-server", args...)
	if err := s.cmd.Start(); err != nil {
		s.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", s.addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s did not start: %v", s.addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the server and waits for it to exit.
func (s *server) stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	_ = s.cmd.Wait()
	s.cmd = nil
}

// redisAddr returns REDIS_ADDR, or the address of a server started for t.
func redisAddr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("REDIS_ADDR"); addr != "" {
		return addr
	}
	return startServer(t).addr()
}

// newClient returns a client of the test's Redis, closed when t ends.
func newClient(t testing.TB, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		unavailable(t, fmt.Sprintf("PING %s: %v", addr, err))
	}
	return c
}

// subscribed waits until s has read the confirmation of its
// subscription (its first Acquire starts it), failing t after 5 s. Until
// then what other processes publish does not reach s, and when the
// confirmation comes every queue of s asks Redis again, forgetting the
// waits Redis told it: a test of what a process learns from Redis, or from
// the others, lets it subscribe first. (On a loaded machine the
// confirmation can come after a test's first claims.)
func subscribed(t testing.TB, s *redisstore.Store) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); s.Resyncs() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the Store's subscription was not confirmed within 5 s")
		}
	}
}

var prefixSeq atomic.Uint64

// testPrefix returns a key prefix unique to this test and run.
func testPrefix(t testing.TB) string {
	name := strings.NewReplacer("/", ".", " ", "_").Replace(t.Name())
	return fmt.Sprintf("ratecordtest:%d:%d:%s", time.Now().UnixNano(), prefixSeq.Add(1), name)
}
