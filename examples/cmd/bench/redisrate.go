package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/internal/bench"
	"github.com/ratecord/ratecord/internal/rediscount"
)

// NameRedisRate is the name of the [RedisRate] contender.
const NameRedisRate = "redis_rate"

// RedisRate is go-redis/redis_rate used as a bot's shared limiter, on the
// Redis of the run (-redis or -redis-cluster): per request, one
// Limiter.Allow keyed by the credential with the bot's global limit; while
// refused, it waits RetryAfter and asks again; then it sends the request.
//
// It knows nothing of Discord's buckets, so it gets 429s on their limits:
// it is in the table for what its Allow costs Redis under the same load as
// ratecord-redis, measured the same way (commands sent through a go-redis
// hook, commands executed and CPU from the server's INFO), not as a rival
// on correctness. Each client, one per process or worker, has its own
// go-redis client and limiter. Its keys live under the run's prefix
// ([bench.RunPrefix]) and are deleted after the run.
func RedisRate(rc bench.RedisConfig) bench.Limiter {
	return bench.Limiter{
		Name: NameRedisRate,
		New: func(base http.RoundTripper, cfg bench.ClientConfig) bench.Client {
			return newRedisRateClient(rc, cfg, base)
		},
		Cleanup: func(run string) { rc.Cleanup(redisRatePrefix(run)) },
		Probe:   rc.Probe,
	}
}

// redisRatePrefix is the prefix of the Redis keys of a run: redis_rate
// puts "rate:" before every key it is given.
func redisRatePrefix(run string) string { return "rate:" + bench.RunPrefix(run) }

// redisRateClient is a redis_rate client: its own go-redis client (and so
// its own connection pool) and limiter, as a process of its own would
// have. It is safe for concurrent use.
type redisRateClient struct {
	bench.HTTPClient
	hook *rediscount.Hook
	rdb  redis.UniversalClient
}

var _ bench.CommandCounter = (*redisRateClient)(nil)

// StoreCommands returns the commands the client has sent to Redis.
func (c *redisRateClient) StoreCommands() int64 { return c.hook.Commands.Load() }

func newRedisRateClient(rc bench.RedisConfig, cfg bench.ClientConfig, base http.RoundTripper) *redisRateClient {
	rdb := rc.NewClient()
	hook := &rediscount.Hook{}
	rdb.AddHook(hook)
	global := cfg.GlobalLimit
	if global <= 0 {
		global = 50 // Discord's default global limit per second
	}
	tr := &allowTransport{
		next:    base,
		limiter: redis_rate.NewLimiter(rdb),
		limit:   redis_rate.PerSecond(global),
		prefix:  bench.RunPrefix(cfg.Run),
	}
	return &redisRateClient{
		HTTPClient: bench.HTTPClient{C: &http.Client{Transport: tr}, Close_: rdb.Close},
		hook:       hook,
		rdb:        rdb,
	}
}

// allowTransport takes a slot of the credential's global limit from
// redis_rate before it sends each request. It is safe for concurrent use.
type allowTransport struct {
	next    http.RoundTripper
	limiter *redis_rate.Limiter
	limit   redis_rate.Limit
	prefix  string // the run's key prefix
}

var _ http.RoundTripper = (*allowTransport)(nil)

// RoundTrip keys the request, waits for a slot, and sends it.
func (t *allowTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := t.allow(req.Context(), t.key(req)); err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	return t.next.RoundTrip(req)
}

// key is the request's key: the run's prefix and a digest of the
// Authorization header, so no token is written to Redis, or "ip" for a
// request without one.
func (t *allowTransport) key(req *http.Request) string {
	auth := req.Header.Get("Authorization")
	if auth == "" {
		return t.prefix + ":ip"
	}
	sum := sha256.Sum256([]byte(auth))
	return t.prefix + ":" + hex.EncodeToString(sum[:16])
}

// allow asks redis_rate for a slot of key until it grants one, waiting
// RetryAfter between refusals, or until ctx ends.
func (t *allowTransport) allow(ctx context.Context, key string) error {
	for {
		res, err := t.limiter.Allow(ctx, key, t.limit)
		if err != nil {
			return err
		}
		if res.Allowed > 0 {
			return nil
		}
		timer := time.NewTimer(max(res.RetryAfter, 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		case <-timer.C:
		}
	}
}
