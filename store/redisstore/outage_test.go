package redisstore_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// Environment of the worker processes of TestOutage.
const (
	envOutageWorker = "RATECORD_OUTAGE_WORKER" // the worker's number
	envOutageRedis  = "RATECORD_OUTAGE_REDIS"
	envOutagePrefix = "RATECORD_OUTAGE_PREFIX"
	envOutageAPI    = "RATECORD_OUTAGE_API"
)

const (
	ogWorkers  = 3
	ogToken    = "Bot outage-token"
	ogGlobal   = 50 // per second
	ogLimit    = 5  // per ogWindow on each channel
	ogWindow   = time.Second
	ogDeadline = time.Second // of every request
	ogLate     = 50 * time.Millisecond
	ogWarmup   = 2500 * time.Millisecond // load before the outage
	ogOutage   = 3 * time.Second
	ogRun      = 10 * time.Second // each worker's load, outage included
	ogMaxSends = 3000             // per goroutine of a worker
	ogPause    = 20 * time.Millisecond
)

// ogResult is what an outage worker prints on its last line.
const ogResult = "OUTAGE-RESULT"

// TestOutage runs this test binary again as three worker processes that
// share one Redis (started here) and one emulator under the load of one
// channel (5 per second in fixed windows, for all of them together) and a
// fan-out over a hundred others (bound by the global limit of 50 per
// second), every request with a deadline of one second. Redis then fails for three
// seconds: killed and restarted on the same port, or stalled by DEBUG
// SLEEP. The emulator must see no avoidable 429 and no ban, during the
// outage, on the fallback or on the return to Redis; every request must
// end with a response or a typed error, none more than 50 ms after its
// deadline.
func TestOutage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		outage func(t *testing.T, srv *server)
	}{
		{"kill", func(t *testing.T, srv *server) {
			srv.stop()
			time.Sleep(ogOutage)
			srv.start()
		}},
		{"stall", func(t *testing.T, srv *server) {
			c := redis.NewClient(&redis.Options{Addr: srv.addr(), ReadTimeout: ogOutage + 5*time.Second})
			defer c.Close()
			if err := c.Do(t.Context(), "DEBUG", "SLEEP", fmt.Sprint(ogOutage.Seconds())).Err(); err != nil {
				t.Errorf("DEBUG SLEEP: %v", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { runOutage(t, tc.outage) })
	}
}

func runOutage(t *testing.T, outage func(t *testing.T, srv *server)) {
	rs := startServer(t, "--enable-debug-command", "local")
	newClient(t, rs.addr()) // skips when the server does not answer
	emu, err := discordtest.Start(
		discordtest.WithoutDefaultTable(),
		discordtest.WithGlobalLimit(ogGlobal),
		discordtest.WithBuckets(discordtest.Bucket{Hash: "og", Limit: ogLimit, Window: ogWindow, Fixed: true}),
		discordtest.WithRoutes(discordtest.Route{Template: "POST /channels/{channel_id}/messages", Bucket: "og"}),
		discordtest.WithTokens(ogToken),
		discordtest.WithLatency(2*time.Millisecond, 2*time.Millisecond),
		discordtest.WithInvalidRequestLimit(100, time.Minute),
		discordtest.WithLogLimit(100000),
	)
	if err != nil {
		t.Fatalf("start the emulator: %v", err)
	}
	t.Cleanup(emu.Close)

	ctx, cancel := context.WithTimeout(t.Context(), ogRun+30*time.Second)
	defer cancel()
	prefix := testPrefix(t)
	var wg sync.WaitGroup
	errs := make([]error, ogWorkers)
	outs := make([]strings.Builder, ogWorkers)
	for i := range ogWorkers {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestOutageWorker$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			envOutageWorker+"="+fmt.Sprint(i), envOutageRedis+"="+rs.addr(), envOutagePrefix+"="+prefix,
			envOutageAPI+"="+emu.URL()+"/api/v10")
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatalf("start worker %d: %v", i, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Wait()
		}()
	}
	time.Sleep(ogWarmup)
	began := time.Now()
	outage(t, rs)
	ended := time.Now()
	t.Logf("outage from +%v to +%v", ogWarmup, ogWarmup+ended.Sub(began).Round(time.Millisecond))
	wg.Wait()

	for i, err := range errs {
		out := outs[i].String()
		if err != nil {
			t.Errorf("worker %d: %v\n%s", i, err, out)
			continue
		}
		if !strings.Contains(out, "--- PASS: TestOutageWorker") {
			t.Errorf("worker %d did not pass its test:\n%s", i, out)
		}
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			if rest, ok := strings.CutPrefix(line, ogResult+" "); ok {
				t.Logf("worker %d: %s", i, relativeTimes(rest, began, ended))
			}
		}
	}

	st := emu.Stats()
	for _, e := range st.Log {
		if e.Status == http.StatusTooManyRequests {
			t.Logf("429 at %+v after the outage began: %s %s scope %s avoidable %v",
				e.Time.Sub(began).Round(time.Millisecond), e.Route, e.Major, e.Scope, e.Avoidable)
		}
	}
	t.Logf("emulator: %d requests, by status %v, 429s by scope %v, %d on the shared channel",
		st.Requests, st.ByStatus, st.ByScope, st.Successes[discordtest.BucketKey{Hash: "og", Major: "channels/1"}])
	if st.Avoidable > 0 {
		t.Errorf("the emulator counted %d avoidable 429s (by scope %v); want none", st.Avoidable, st.ByScope)
	}
	if st.Banned || st.BannedResponses > 0 {
		t.Errorf("the emulator banned the processes (%d banned responses)", st.BannedResponses)
	}
	if ok := st.ByStatus[http.StatusOK]; ok < ogGlobal {
		t.Errorf("%d successes in all; want at least %d", ok, ogGlobal)
	}
}

// relativeTimes rewrites the fields fallback=<unix ms> and
// recovered=<unix ms> of a worker's result as times after the outage
// began and after it ended.
func relativeTimes(line string, began, ended time.Time) string {
	fields := strings.Fields(line)
	for i, f := range fields {
		for _, k := range []struct {
			name string
			from time.Time
			what string
		}{{"fallback=", began, "after the outage began"}, {"recovered=", ended, "after it ended"}} {
			if v, ok := strings.CutPrefix(f, k.name); ok {
				var ms int64
				if _, err := fmt.Sscan(v, &ms); err == nil && ms > 0 {
					fields[i] = fmt.Sprintf("%s%v(%s)", k.name, time.UnixMilli(ms).Sub(k.from).Round(time.Millisecond), k.what)
				}
			}
		}
	}
	return strings.Join(fields, " ")
}

// TestOutageWorker is the body of a worker process of TestOutage; it
// skips when run otherwise.
func TestOutageWorker(t *testing.T) {
	worker := os.Getenv(envOutageWorker)
	if worker == "" {
		t.Skip("a worker process of TestOutage")
	}
	// Worker 0 uses the client settings docs/redis.md recommends, the others
	// go-redis' defaults: the store must not depend on them.
	opts := &redis.Options{Addr: os.Getenv(envOutageRedis)}
	if worker == "0" {
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout = 500*time.Millisecond, time.Second, time.Second, time.Second
		opts.ContextTimeoutEnabled = true
	}
	client := redis.NewClient(opts)
	t.Cleanup(func() { client.Close() })
	var fellAt, recoveredAt atomic.Int64
	s := redisstore.New(client, redisstore.WithPrefix(os.Getenv(envOutagePrefix)), redisstore.WithPolicy(store.Policy{GlobalLimit: ogGlobal}),
		redisstore.WithOnFallback(func(error) { fellAt.CompareAndSwap(0, time.Now().UnixMilli()) }))
	t.Cleanup(func() { s.Close() })
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := ratecord.NewTransport(base, ratecord.WithStore(s))
	t.Cleanup(func() { tr.Close() })
	hc := &http.Client{Transport: tr}
	api := os.Getenv(envOutageAPI)

	ctx, cancel := context.WithTimeout(t.Context(), ogRun)
	defer cancel()
	// Note when the store returns to Redis.
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if fellAt.Load() != 0 && recoveredAt.Load() == 0 && s.Stats().Recoveries > 0 {
				recoveredAt.Store(time.Now().UnixMilli())
			}
		}
	}()

	var sent, ok, tooMany, typed, late atomic.Int64
	var maxLate atomic.Int64
	var mu sync.Mutex
	var others []string
	send := func(channel int) {
		rctx, rcancel := context.WithTimeout(ctx, ogDeadline)
		defer rcancel()
		deadline, _ := rctx.Deadline()
		req, _ := http.NewRequestWithContext(rctx, "POST", fmt.Sprintf("%s/channels/%d/messages", api, channel), strings.NewReader(`{"content":"hi"}`))
		req.Header.Set("Authorization", ogToken)
		req.Header.Set("Content-Type", "application/json")
		sent.Add(1)
		resp, err := hc.Do(req)
		if d := time.Since(deadline); d > 0 {
			for {
				m := maxLate.Load()
				if int64(d) <= m || maxLate.CompareAndSwap(m, int64(d)) {
					break
				}
			}
			if d > ogLate {
				late.Add(1)
			}
		}
		if err == nil {
			ok.Add(1)
			if resp.StatusCode == http.StatusTooManyRequests {
				tooMany.Add(1)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return
		}
		var rl *ratecord.RateLimitError
		if errors.As(err, &rl) || errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			typed.Add(1)
			// A refusal comes at once: pause as a caller would, rather
			// than spin.
			select {
			case <-time.After(ogPause):
			case <-ctx.Done():
			}
			return
		}
		mu.Lock()
		others = append(others, err.Error())
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < ogMaxSends && ctx.Err() == nil; i++ {
				channel := 1 // the shared bucket
				if g%2 == 1 {
					channel = 100 + (g*7+i)%100 // fan-out: the global limit binds
				}
				send(channel)
			}
		}()
	}
	wg.Wait()
	<-watched
	st := s.Stats()
	fmt.Printf("%s worker=%s sent=%d responses=%d 429s=%d typed-errors=%d other-errors=%d late=%d max-late=%v fallback=%d recovered=%d fallbacks=%d recoveries=%d local-grants=%d stalls=%d errors=%d queued=%d dropped=%d\n",
		ogResult, worker, sent.Load(), ok.Load(), tooMany.Load(), typed.Load(), len(others), late.Load(),
		time.Duration(maxLate.Load()).Round(time.Millisecond), fellAt.Load(), recoveredAt.Load(),
		st.Fallbacks, st.Recoveries, st.LocalGrants, st.Stalls, st.Errors, st.Queued, st.Dropped)
	for _, e := range others {
		t.Errorf("worker %s: a request failed with an untyped error: %s", worker, e)
	}
	if n := late.Load(); n > 0 {
		t.Errorf("worker %s: %d responses came more than %v after their deadline (the latest %v)", worker, n, ogLate, time.Duration(maxLate.Load()))
	}
	if st.Fallbacks == 0 || st.Recoveries == 0 {
		t.Errorf("worker %s: Stats() = %+v; want a fallback and a recovery", worker, st)
	}
}
