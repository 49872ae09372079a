package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/examples/internal/testredis"
	"github.com/ratecord/ratecord/internal/bench"
)

func TestAllowTransportKey(t *testing.T) {
	t.Parallel()
	tr := &allowTransport{prefix: "p"}
	tests := []struct {
		name, auth string
		want       string
	}{
		{"no Authorization is keyed by IP", "", "p:ip"},
		{"a bot token is keyed by the first 16 bytes of its SHA-256", "Bot abc.def.ghi", "p:8c2d6c6b27a3f9dcd7995b4741e3dd47"},
	}
	for _, tt := range tests {
		req, _ := http.NewRequest(http.MethodGet, "http://x/api/v10/users/@me", nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		if got := tr.key(req); got != tt.want {
			t.Errorf("%s: key(Authorization %q) = %q; want %q", tt.name, tt.auth, got, tt.want)
		}
	}
}

// saturate returns the saturate scenario of the LAN profile.
func saturate(t *testing.T) bench.Scenario {
	t.Helper()
	for _, sc := range bench.Scenarios(discordtest.LANNetwork()) {
		if sc.Name == "saturate" {
			return sc
		}
	}
	t.Fatal("no saturate scenario")
	return bench.Scenario{}
}

// TestRedisRateRun runs redis_rate as two workers for one short scenario
// against a real Redis: it must send requests, each worker through its own
// go-redis client whose hook counts its commands, the run must read the
// server's commands and CPU, and the run's keys must be gone after it.
func TestRedisRateRun(t *testing.T) {
	addr := testredis.Addr(t)
	rc := bench.RedisConfig{Addr: addr}
	lim := RedisRate(rc)
	var mu sync.Mutex
	var clients []*redisRateClient
	var runs []string
	inner := lim.New
	lim.New = func(base http.RoundTripper, cfg bench.ClientConfig) bench.Client {
		c := inner(base, cfg).(*redisRateClient)
		mu.Lock()
		clients, runs = append(clients, c), append(runs, cfg.Run)
		mu.Unlock()
		return c
	}
	const workers = 2
	rs, err := bench.Run(t.Context(), []bench.Scenario{saturate(t)}, []bench.Limiter{lim},
		bench.Options{Duration: 600 * time.Millisecond, Network: discordtest.LANNetwork(), Workers: workers, Goroutines: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(clients) != workers {
		t.Fatalf("%d clients made; want one per worker, %d", len(clients), workers)
	}
	var sum int64
	rdbs := map[redis.UniversalClient]bool{}
	for i, c := range clients {
		rdbs[c.rdb] = true
		if n := c.StoreCommands(); n == 0 {
			t.Errorf("client %d sent no command through its own Redis client", i)
		}
		sum += c.StoreCommands()
	}
	if len(rdbs) != workers {
		t.Errorf("%d Redis clients among %d workers; want each its own", len(rdbs), workers)
	}
	r := rs[0]
	if r.Limiter != NameRedisRate || r.Requests == 0 || r.All2xx == 0 {
		t.Fatalf("result: limiter %q, %d requests, %d 2xx; want %q with requests sent and answered", r.Limiter, r.Requests, r.All2xx, NameRedisRate)
	}
	if r.StoreCommands != sum || r.StoreSentPer2xx <= 0 {
		t.Errorf("result counts %d commands sent (%v per 2xx); the clients' hooks %d", r.StoreCommands, r.StoreSentPer2xx, sum)
	}
	if r.StoreSeconds <= 0 || r.StoreExecuted == 0 || r.StoreCPU <= 0 {
		t.Errorf("result: span %vs, %d commands executed, CPU %v; want all of them read from the server", r.StoreSeconds, r.StoreExecuted, r.StoreCPU)
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if keys, err := c.Keys(ctx, redisRatePrefix(runs[0])+":*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("keys of the run left after it: %v, %v; want none", keys, err)
	}
}

// TestMainRunsRedisRate runs the command's bench with -redis: redis_rate
// is a contender and gets the Redis columns; without -redis, naming it is
// an error.
func TestMainRunsRedisRate(t *testing.T) {
	addr := testredis.Addr(t)
	lim := bench.Limiter{Name: NameRedisRate, Redis: RedisRate}
	var out bytes.Buffer
	err := bench.Main(t.Context(), []string{"-redis", addr, "-limiters", NameRedisRate, "-scenario", "saturate", "-duration", "500ms", "-json"},
		&out, io.Discard, lim)
	if err != nil {
		t.Fatal(err)
	}
	var rows []bench.Row
	if err := json.Unmarshal(out.Bytes(), &rows); err != nil {
		t.Fatalf("output is not the rows' JSON: %v\n%s", err, out.String())
	}
	if len(rows) != 1 {
		t.Fatalf("%d rows; want 1", len(rows))
	}
	r := rows[0]
	if r.Limiter != NameRedisRate || r.Requests == 0 || r.StoreCommands == 0 || r.StoreExecuted == 0 || r.StoreCPU <= 0 {
		t.Errorf("row: limiter %q, %d requests, %d commands sent, %d executed, CPU %v; want %q with all of them",
			r.Limiter, r.Requests, r.StoreCommands, r.StoreExecuted, r.StoreCPU, NameRedisRate)
	}
	err = bench.Main(t.Context(), []string{"-limiters", NameRedisRate, "-scenario", "saturate"}, io.Discard, io.Discard, lim)
	if err == nil || !strings.Contains(err.Error(), "needs -redis") {
		t.Errorf("Main(-limiters %s) without -redis = %v; want an error saying it needs -redis", NameRedisRate, err)
	}
}
