package redisstore_test

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
	"github.com/ratecord/ratecord/store/storetest"
)

// TestRingConformance runs the conformance suite against a ring of two
// servers: the hash tag keeps each credential's keys on one shard.
func TestRingConformance(t *testing.T) {
	a, b := startServer(t), startServer(t)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": a.addr(), "b": b.addr()}})
	t.Cleanup(func() { ring.Close() })
	if err := ring.Ping(t.Context()).Err(); err != nil {
		t.Fatalf("PING ring: %v", err)
	}
	storetest.Run(t, func(t *testing.T, p store.Policy) store.Store {
		return redisstore.New(ring, redisstore.WithPolicy(p), redisstore.WithPrefix(testPrefix(t)), redisstore.WithFailurePolicy(redisstore.FailClosed))
	})
}
