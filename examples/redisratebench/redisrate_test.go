// Package redisratebench compares the Redis round trips of ratecord's
// Redis store with go-redis/redis_rate on the same server, in one run:
//
//	REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench . -benchtime 3s ./redisratebench
//
// Each benchmark also reports the Redis server's own time per operation
// (server-us/op), from INFO commandstats before and after: the script
// calls' usec, and every other command's, summed.
//
// BenchmarkRedisRateAllow measures one limiter.Allow (one script call) with
// a per-second limit that never denies. BenchmarkRedisstoreAcquireUpdate
// measures what ratecord does per request: Acquire on a known bucket with
// plenty remaining and a global limit that never binds (one claim script),
// then Update with the response's headers (one update script). Each
// benchmark uses its own key prefix; nothing is flushed.
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

// serverUsec returns the total usec INFO commandstats reports for every
// command, or -1 when it cannot be read.
func serverUsec(c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		return -1
	}
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_") || strings.HasPrefix(line, "cmdstat_info:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(line[strings.IndexByte(line, ':')+1:]), ",") {
			if v, ok := strings.CutPrefix(f, "usec="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total
}

// reportServer reports the server time per operation since before.
func reportServer(b *testing.B, c *redis.Client, before float64) {
	if after := serverUsec(c); before >= 0 && after >= 0 && b.N > 0 {
		b.ReportMetric((after-before)/float64(b.N), "server-us/op")
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
	before := serverUsec(c)
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
	before := serverUsec(c)
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
