package bench

import (
	"context"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/internal/rediscount"
	"github.com/ratecord/ratecord/store/redisstore"
)

// RedisConfig says which Redis the limiters with a shared store use (the
// server or cluster of -redis or -redis-cluster): a server (Addr) or a
// cluster (Cluster, its seed addresses).
type RedisConfig struct {
	Addr    string
	Cluster []string
}

// NewClient returns a new client of the server or cluster, with a
// connection pool of its own; the caller closes it.
func (rc RedisConfig) NewClient() redis.UniversalClient {
	if len(rc.Cluster) > 0 {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Cluster})
	}
	return redis.NewClient(&redis.Options{Addr: rc.Addr})
}

// Ping checks that the server or cluster answers.
func (rc RedisConfig) Ping(ctx context.Context) error {
	c := rc.NewClient()
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.Ping(ctx).Err()
}

// RunPrefix is the Redis key prefix of a scenario run.
func RunPrefix(run string) string { return "ratecord-bench:" + run }

// Ratecord limiter names when a shared store is measured beside memory
// stores.
const (
	NameRedis  = "ratecord-redis"
	NameMemory = "ratecord-mem"
)

// RatecordRedis is ratecord with its state in Redis: every process of a
// scenario run shares one redisstore.Store key prefix, so limits hold
// across processes. Its clients count the commands they send to Redis.
func RatecordRedis(rc RedisConfig) Limiter {
	return Limiter{
		Name: NameRedis,
		New: func(base http.RoundTripper, cfg ClientConfig) Client {
			if cfg.Run == "" {
				cfg.Run = runID("", NameRedis)
			}
			return newRedisClient(rc, cfg, base)
		},
		Cleanup: func(run string) { rc.Cleanup(RunPrefix(run)) },
		Probe:   rc.Probe,
	}
}

// RatecordMemory is the default ratecord limiter under another name, to be
// told apart from RatecordRedis in one table: each process has its own
// memory store.
func RatecordMemory() Limiter {
	l := Ratecord()
	l.Name = NameMemory
	return l
}

// redisClient is a ratecord-redis client: its own Redis client (and so
// its own connection pool), store and ratecord transport, as a process of
// its own would have.
type redisClient struct {
	HTTPClient
	hook  *rediscount.Hook
	rdb   redis.UniversalClient
	store *redisstore.Store
	tr    *ratecord.Transport
}

func (c *redisClient) StoreCommands() int64 { return c.hook.Commands.Load() }

func newRedisClient(rc RedisConfig, cfg ClientConfig, base http.RoundTripper) Client {
	rdb := rc.NewClient()
	hook := &rediscount.Hook{}
	rdb.AddHook(hook)
	s := redisstore.New(rdb, redisstore.WithPrefix(RunPrefix(cfg.Run)), redisstore.WithPolicy(policy(cfg)), redisstore.WithLogger(cfg.Logger))
	tr := ratecord.NewTransport(base, ratecord.WithStore(s))
	return &redisClient{
		HTTPClient: HTTPClient{C: &http.Client{Transport: tr}, Close_: func() error {
			tr.Close()
			s.Close()
			return rdb.Close()
		}},
		hook:  hook,
		rdb:   rdb,
		store: s,
		tr:    tr,
	}
}

// Cleanup deletes the keys under prefix+":" on the server, or on every
// master of the cluster: a run's keys would expire by themselves, but a
// shared server need not keep them for an hour. It gives up after ten
// seconds.
func (rc RedisConfig) Cleanup(prefix string) {
	c := rc.NewClient()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		_ = cc.ForEachMaster(ctx, del)
		return
	}
	_ = del(ctx, c.(*redis.Client))
}
