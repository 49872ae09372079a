package redisratebench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// The busy benchmarks measure what a request costs a Redis server that is
// kept busy: many bots, many channels, several processes, every caller
// asking as fast as it can, so that one call follows another on the
// server. A Redis core's capacity is set there, not at the light loads of
// "ratecord bench", where every call arrives at a server that was idle and
// pays for it (see BenchmarkStep's sparse cases in store/redisstore):
//
//	REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench Busy -benchtime 3s ./redisratebench
//
// busyBots bots (credentials) each send on busyChannels channels, through
// busyProcs Stores, each with its own client, as separate processes would
// have. A bucket's limit (busyLimit per second) stays below the size from
// which a Store lends a lease, so every request is claimed through Redis,
// and no bucket binds: at the rates a 2-core machine reaches, a channel
// sees a request every few hundred milliseconds. The global limit never
// binds either.
const (
	busyBots     = 64
	busyChannels = 64
	busyProcs    = 4
	busyLimit    = 50
)

// busyCallers is how many goroutines per CPU the busy benchmarks run.
const busyCallers = 16

// BenchmarkBusyRedisRateAllow is one limiter.Allow per operation on the
// key of one of busyBots bots, from many callers at once.
func BenchmarkBusyRedisRateAllow(b *testing.B) {
	c := client(b)
	p := prefix(b)
	cleanup(b, c, p)
	limiter := redis_rate.NewLimiter(c)
	limit := redis_rate.PerSecond(1 << 30)
	keys := make([]string, busyBots)
	for i := range keys {
		keys[i] = p + ":bot" + strconv.Itoa(i)
	}
	ctx := context.Background()
	runBusy(b, c, func(n uint64) error {
		res, err := limiter.Allow(ctx, keys[n%busyBots], limit)
		if err == nil && res.Allowed != 1 {
			err = fmt.Errorf("Allow = %+v; want allowed", res)
		}
		return err
	})
}

// runBusy runs op from busyCallers goroutines per CPU, each call with the
// next number of a count, and reports the server's figures per operation.
func runBusy(b *testing.B, c *redis.Client, op func(n uint64) error) {
	var next atomic.Uint64
	before := readServer(c)
	b.SetParallelism(busyCallers)
	b.ResetTimer()
	defer reportServer(b, c, before)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := op(next.Add(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkBusyRedisstore is one Acquire and its Report per operation: a
// message to one of busyChannels channels of one of busyBots bots, counted
// in the bot's global window, through one of busyProcs Stores.
func BenchmarkBusyRedisstore(b *testing.B) {
	c := client(b)
	p := prefix(b)
	cleanup(b, c, p)
	stores := make([]*redisstore.Store, busyProcs)
	for i := range stores {
		cl := redis.NewClient(c.Options())
		b.Cleanup(func() { cl.Close() })
		stores[i] = redisstore.New(cl, redisstore.WithPrefix(p),
			redisstore.WithPolicy(store.Policy{GlobalLimit: 1 << 20}))
		b.Cleanup(func() { stores[i].Close() })
	}
	claims := make([]store.Claim, busyBots*busyChannels)
	for i := range claims {
		claims[i] = store.Claim{Credential: "bot" + strconv.Itoa(i/busyChannels), Route: "POST /channels/:id/messages",
			Major: "channels/" + strconv.Itoa(i%busyChannels), Global: true}
	}
	update := store.Update{Sent: true, Status: 200, Bucket: "abcd", HasLimit: true, Limit: busyLimit,
		Remaining: busyLimit - 1, ResetAfter: time.Second}
	ctx := context.Background()
	// Every process learns every bucket outside the measurement.
	for _, s := range stores {
		for _, cl := range claims {
			r, err := s.Acquire(ctx, cl)
			if err != nil {
				b.Fatal(err)
			}
			if err := r.Report(ctx, update); err != nil {
				b.Fatal(err)
			}
		}
	}
	runBusy(b, c, func(n uint64) error {
		// Spread over the claims with a stride prime to their number, so
		// that the callers of one moment meet different buckets.
		s, cl := stores[n%busyProcs], claims[(n*7919)%uint64(len(claims))]
		r, err := s.Acquire(ctx, cl)
		if err != nil {
			return err
		}
		return r.Report(ctx, update)
	})
}
