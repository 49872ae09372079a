// Package testredis gives the examples' tests a Redis server: REDIS_ADDR,
// or a redis-server of their own.
package testredis

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Addr returns REDIS_ADDR, or the address of a redis-server started
// for t on a free loopback port and killed when t ends. Without either it
// skips t, or fails it when the environment variable CI is "true".
func Addr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = startRedis(t)
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		noRedis(t, fmt.Sprintf("PING %s: %v", addr, err))
	}
	return addr
}

func noRedis(t *testing.T, why string) {
	t.Helper()
	msg := "no Redis for this test: set REDIS_ADDR to a server's address, or put redis-server on PATH (" + why + ")"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// startRedis starts a redis-server without persistence and returns its
// address once it accepts connections.
func startRedis(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		noRedis(t, "redis-server not found on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen on a free loopback port: %v", err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", t.TempDir(), "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		noRedis(t, fmt.Sprintf("start redis-server: %v", err))
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + port
	for deadline := time.Now().Add(5 * time.Second); ; {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			noRedis(t, fmt.Sprintf("redis-server on %s did not start: %v", addr, err))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
