// Package redisratebench compares the Redis round trips of ratecord's
// Redis store with go-redis/redis_rate on the same server, in one run:
//
//	REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench . -benchtime 3s ./redisratebench
//
// Each benchmark also reports the Redis server's own time per operation
// (server-us/op), from INFO commandstats before and after: the script
// calls' usec, and every other command's, summed; the script calls per
// operation (scripts/op: EVAL, EVALSHA and FCALL); and the server's CPU
// time per operation (cpu-us/op), from INFO cpu before and after:
// used_cpu_sys plus used_cpu_user, every thread of the server, so what
// commandstats does not time (reading requests, writing replies, the
// event loop) is in it. The idle server's own CPU (its cron, a few ms per
// second) is not subtracted: at the ten thousand and more operations per
// second these benchmarks run, it adds a fraction of a microsecond per
// operation.
//
// BenchmarkRedisRateAllow measures one limiter.Allow (one script call) with
// a per-second limit that never denies. BenchmarkRedisstoreAcquireUpdate
// measures what ratecord does per request: Acquire on a known bucket with
// plenty remaining and a global limit that never binds, then Report with
// the response's headers. The Store sends a report with its next claim,
// and a bucket this large lends the Store a lease of slots, so most
// operations call no script (scripts/op shows how many do). The busy
// benchmarks (busy_test.go) measure the same two with many keys and many
// callers at once, ratecord without a lease. Each benchmark uses its own
// key prefix; nothing is flushed.
package redisratebench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// client returns a client of REDIS_ADDR or 127.0.0.1:6379, or skips b
// when neither answers.
func client(b *testing.B) *redis.Client {
	b.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		b.Skipf("no Redis at %s (set REDIS_ADDR): %v", addr, err)
	}
	return c
}

var seq atomic.Uint64

func prefix(b *testing.B) string {
	return fmt.Sprintf("ratecordbench:%d:%d:%s", time.Now().UnixNano(), seq.Add(1), b.Name())
}

// cleanup deletes the keys under p when b ends.
func cleanup(b *testing.B, c *redis.Client, p string) {
	b.Cleanup(func() {
		ctx := context.Background()
		iter := c.Scan(ctx, 0, p+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
	})
}

// server is a reading of the Redis server's counters, in microseconds:
// usec, what INFO commandstats reports for every command but INFO, and
// cpu, used_cpu_sys plus used_cpu_user of INFO cpu. A field is -1 when it
// could not be read.
type server struct {
	usec, cpu float64
	scripts   float64 // calls of scripts and functions (EVAL, EVALSHA, FCALL)
}

// readServer reads INFO commandstats and cpu.
func readServer(c *redis.Client) server {
	info, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		return server{usec: -1, cpu: -1}
	}
	return parseServer(info)
}

// parseServer reads a server reading from the text of INFO commandstats
// and cpu.
func parseServer(info string) server {
	var usec, cpu, scripts float64
	var sys, user bool
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return server{usec: -1, cpu: -1}
			}
			cpu += f * 1e6
			sys, user = sys || k == "used_cpu_sys", user || k == "used_cpu_user"
		case strings.HasPrefix(k, "cmdstat_") && k != "cmdstat_info":
			script := k == "cmdstat_eval" || k == "cmdstat_evalsha" || k == "cmdstat_fcall"
			for _, f := range strings.Split(v, ",") {
				if n, ok := strings.CutPrefix(f, "usec="); ok {
					u, _ := strconv.ParseFloat(n, 64)
					usec += u
				}
				if n, ok := strings.CutPrefix(f, "calls="); ok && script {
					u, _ := strconv.ParseFloat(n, 64)
					scripts += u
				}
			}
		}
	}
	if !sys || !user {
		cpu = -1
	}
	return server{usec: usec, cpu: cpu, scripts: scripts}
}

func TestParseServer(t *testing.T) {
	t.Parallel()
	const stats = "# Commandstats\r\n" +
		"cmdstat_evalsha:calls=10,usec=120,usec_per_call=12.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_hget:calls=30,usec=15,usec_per_call=0.50,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=0\r\n"
	const cpu = "# CPU\r\nused_cpu_sys:0.250000\r\nused_cpu_user:0.500000\r\nused_cpu_sys_children:7.000000\r\n" +
		"used_cpu_user_children:7.000000\r\nused_cpu_sys_main_thread:0.200000\r\nused_cpu_user_main_thread:0.400000\r\n"
	for _, tt := range []struct {
		name, info string
		want       server
	}{
		{"both sections; INFO and the children left out", stats + "\r\n" + cpu, server{usec: 135, cpu: 750000, scripts: 10}},
		{"no cpu section", stats, server{usec: 135, cpu: -1, scripts: 10}},
		{"a cpu figure that is no number", "used_cpu_sys:x\r\nused_cpu_user:1\r\n", server{usec: -1, cpu: -1}},
	} {
		if got := parseServer(tt.info); got != tt.want {
			t.Errorf("%s: parseServer(%q) = %+v; want %+v", tt.name, tt.info, got, tt.want)
		}
	}
}

// reportServer reports the server's time and CPU per operation since
// before.
func reportServer(b *testing.B, c *redis.Client, before server) {
	after := readServer(c)
	if b.N == 0 {
		return
	}
	if before.usec >= 0 && after.usec >= 0 {
		b.ReportMetric((after.usec-before.usec)/float64(b.N), "server-us/op")
	}
	if before.usec >= 0 && after.usec >= 0 {
		b.ReportMetric((after.scripts-before.scripts)/float64(b.N), "scripts/op")
	}
	if before.cpu >= 0 && after.cpu >= before.cpu {
		b.ReportMetric((after.cpu-before.cpu)/float64(b.N), "cpu-us/op")
	}
}

func BenchmarkRedisRateAllow(b *testing.B) {
	c := client(b)
	p := prefix(b)
	cleanup(b, c, p)
	limiter := redis_rate.NewLimiter(c)
	limit := redis_rate.PerSecond(1 << 30)
	key := p + ":bot"
	ctx := context.Background()
	before := readServer(c)
	b.ReportAllocs()
	b.ResetTimer()
	defer reportServer(b, c, before)
	for b.Loop() {
		res, err := limiter.Allow(ctx, key, limit)
		if err != nil {
			b.Fatal(err)
		}
		if res.Allowed != 1 {
			b.Fatalf("Allow = %+v; want allowed", res)
		}
	}
}

func BenchmarkRedisstoreAcquireUpdate(b *testing.B) {
	c := client(b)
	p := prefix(b)
	cleanup(b, c, p)
	s := redisstore.New(c, redisstore.WithPrefix(p),
		redisstore.WithPolicy(store.Policy{GlobalLimit: 1 << 30, GlobalHold: 10 * time.Millisecond}))
	b.Cleanup(func() { s.Close() })
	claim := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true}
	update := store.Update{
		Sent: true, Status: 200, Bucket: "abcd", HasLimit: true, Limit: 1 << 30, Remaining: 1 << 29,
		ResetAfter: time.Hour,
	}
	ctx := context.Background()
	// Learn the bucket outside the measurement.
	pm, err := s.Acquire(ctx, claim)
	if err != nil {
		b.Fatal(err)
	}
	if err := pm.Report(ctx, update); err != nil {
		b.Fatal(err)
	}
	before := readServer(c)
	b.ReportAllocs()
	b.ResetTimer()
	defer reportServer(b, c, before)
	for b.Loop() {
		pm, err := s.Acquire(ctx, claim)
		if err != nil {
			b.Fatal(err)
		}
		if err := pm.Report(ctx, update); err != nil {
			b.Fatal(err)
		}
	}
}
