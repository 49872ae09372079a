package redisstore

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
)

// BenchmarkStep measures what one call of the step function costs Redis
// for the shapes of calls the drivers make, back to back on a quiet
// server: the server's own time per call (server-us/op, from INFO
// commandstats), beside the wall time of the round trip. The sparse case
// makes one call every 2 ms, as a server that is mostly idle sees them:
// each call then finds the server's caches cold, and costs it more than
// the same call back to back (the wall time leaves the pauses out).
//
//	REDIS_ADDR=127.0.0.1:6379 go test -run '^$' -bench BenchmarkStep ./store/redisstore
func BenchmarkStep(b *testing.B) {
	c := benchClient(b)
	ctx := context.Background()
	claim := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}
	global := claim
	global.Global = true
	headers := store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true, Limit: 1000000, Remaining: 999000,
		ResetAfter: time.Hour}

	// setup returns a Store whose route is learned on a bucket with room.
	setup := func(b *testing.B) (*Store, credKeys) {
		s := New(c, WithPrefix("ratecordbench:step:"+strconv.FormatInt(time.Now().UnixNano(), 36)),
			WithPolicy(store.Policy{GlobalLimit: 1000000}))
		b.Cleanup(func() { s.Close() })
		r, err := s.Acquire(ctx, global)
		if err != nil {
			b.Fatal(err)
		}
		if err := r.Report(ctx, headers); err != nil {
			b.Fatal(err)
		}
		for deadline := time.Now().Add(2 * time.Second); s.Stats().Queued > 0 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		return s, s.keysOf(claim.Credential)
	}
	call := func(b *testing.B, s *Store, st *step) {
		v, err := st.run(ctx, s).Result()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := parseStep(v, st.nReports, st.nClaims); err != nil {
			b.Fatal(err)
		}
	}
	claimStep := func(s *Store, k credKeys, c *store.Claim, no uint64) *step {
		var st step
		st.claim(s, k, c, "h", 1, 0, permitPrefix(s.id, no, 1), 0, 0)
		st.build(s, k, digest(c.Credential), no, 1000000)
		return &st
	}
	reportStep := func(s *Store, k credKeys, c *store.Claim, no uint64, claims bool) *step {
		var st step
		h := &permit{cred: c.Credential, route: c.Route, major: c.Major, kind: kindLearned, hash: "h",
			member: permitPrefix(s.id, no-1, 1) + "1", global: c.Global}
		st.report(s, k, h, &headers, no, 0)
		if claims {
			st.claim(s, k, c, "h", 1, 0, permitPrefix(s.id, no, 1), 0, 0)
		}
		st.build(s, k, digest(c.Credential), no, 1000000)
		return &st
	}

	for _, bc := range []struct {
		name string
		step func(s *Store, k credKeys, no uint64) *step
		gap  time.Duration // between calls
	}{
		{"claim", func(s *Store, k credKeys, no uint64) *step { return claimStep(s, k, &claim, no) }, 0},
		{"claim-global", func(s *Store, k credKeys, no uint64) *step { return claimStep(s, k, &global, no) }, 0},
		{"report-global", func(s *Store, k credKeys, no uint64) *step { return reportStep(s, k, &global, no, false) }, 0},
		{"report-and-claim-global", func(s *Store, k credKeys, no uint64) *step { return reportStep(s, k, &global, no, true) }, 0},
		{"report-and-claim-global-sparse", func(s *Store, k credKeys, no uint64) *step {
			return reportStep(s, k, &global, no, true)
		}, 2 * time.Millisecond},
	} {
		b.Run(bc.name, func(b *testing.B) {
			s, k := setup(b)
			no := s.calls.Add(1 << 20)
			before := commandUsec(b, c)
			b.ResetTimer()
			for range b.N {
				no++
				call(b, s, bc.step(s, k, no))
				if bc.gap > 0 {
					b.StopTimer()
					time.Sleep(bc.gap)
					b.StartTimer()
				}
			}
			b.StopTimer()
			b.ReportMetric((commandUsec(b, c)-before)/float64(b.N), "server-us/op")
		})
	}
}

// benchClient returns a client of REDIS_ADDR (or 127.0.0.1:6379), skipping
// b without one.
func benchClient(b *testing.B) *redis.Client {
	addr := redisAddrOrDefault()
	c := redis.NewClient(&redis.Options{Addr: addr})
	b.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		b.Skipf("no Redis at %s (set REDIS_ADDR): %v", addr, err)
	}
	return c
}

// commandUsec returns the server's time spent in commands so far, in
// microseconds: the usec of every line of INFO commandstats but INFO's.
func commandUsec(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\n") {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") || name == "cmdstat_info" {
			continue
		}
		for _, f := range strings.Split(stats, ",") {
			if k, v, ok := strings.Cut(f, "="); ok && k == "usec" {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total
}
