package bench

import (
	"io"
	"strings"
	"testing"
)

// TestRedisLimiterNeedsRedis: a contender that keeps its state in Redis
// is left out without -redis, and naming it says what it needs.
func TestRedisLimiterNeedsRedis(t *testing.T) {
	t.Parallel()
	called := false
	peer := Limiter{Name: "peer", Redis: func(RedisConfig) Limiter {
		called = true
		return NoLimiter()
	}}
	for _, name := range []string{"peer", NameRedis} {
		err := Main(t.Context(), []string{"-limiters", name, "-scenario", "saturate"}, io.Discard, io.Discard, peer)
		if err == nil || !strings.Contains(err.Error(), "needs -redis") {
			t.Errorf("Main(-limiters %s) without -redis = %v; want an error saying it needs -redis", name, err)
		}
	}
	if called {
		t.Error("Limiter.Redis was called without -redis")
	}
}
