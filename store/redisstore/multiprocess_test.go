package redisstore_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// Environment of the worker processes of TestMultiProcess.
const (
	envWorker = "RATECORD_MULTIPROCESS_WORKER" // the worker's number
	envRedis  = "RATECORD_MULTIPROCESS_REDIS"
	envPrefix = "RATECORD_MULTIPROCESS_PREFIX"
	envAPI    = "RATECORD_MULTIPROCESS_API"
)

const (
	mpWorkers  = 3
	mpToken    = "Bot multiprocess-token"
	mpDuration = 2 * time.Second
	mpGlobal   = 25 // per second
	mpLimit    = 5  // per mpWindow on each channel
	mpWindow   = 250 * time.Millisecond
)

// TestMultiProcess runs this test binary again as three worker processes
// that share one Redis and drive one emulator: each sends to one channel
// (a bucket of 5 per 250 ms, for all of them together) and fans out over a
// hundred others (bound by the global limit of 25 per second). The emulator
// must see no avoidable 429 and no ban.
func TestMultiProcess(t *testing.T) {
	addr := redisAddr(t)
	newClient(t, addr) // skips when the server does not answer
	srv, err := discordtest.Start(
		discordtest.WithoutDefaultTable(),
		discordtest.WithGlobalLimit(mpGlobal),
		discordtest.WithBuckets(discordtest.Bucket{Hash: "mp", Limit: mpLimit, Window: mpWindow, Fixed: true}),
		discordtest.WithRoutes(discordtest.Route{Template: "POST /channels/{channel_id}/messages", Bucket: "mp"}),
		discordtest.WithTokens(mpToken),
		discordtest.WithLatency(time.Millisecond, time.Millisecond),
		discordtest.WithInvalidRequestLimit(100, time.Minute),
	)
	if err != nil {
		t.Fatalf("start the emulator: %v", err)
	}
	t.Cleanup(srv.Close)

	prefix := testPrefix(t)
	var wg sync.WaitGroup
	errs := make([]error, mpWorkers)
	outs := make([]strings.Builder, mpWorkers)
	for i := range mpWorkers {
		cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestMultiProcessWorker$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(),
			envWorker+"="+fmt.Sprint(i), envRedis+"="+addr, envPrefix+"="+prefix, envAPI+"="+srv.URL()+"/api/v10")
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cmd.Run()
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("worker %d: %v\n%s", i, err, outs[i].String())
		} else if !strings.Contains(outs[i].String(), "--- PASS: TestMultiProcessWorker") {
			t.Errorf("worker %d did not run its test:\n%s", i, outs[i].String())
		}
	}

	st := srv.Stats()
	bucket := st.Successes[discordtest.BucketKey{Hash: "mp", Major: "channels/1"}]
	t.Logf("%d processes, %v: %d requests, %d on the shared channel (limit %d per %v), by status %v, 429s by scope %v",
		mpWorkers, mpDuration, st.Requests, bucket, mpLimit, mpWindow, st.ByStatus, st.ByScope)
	if st.Avoidable > 0 {
		t.Errorf("the emulator counted %d avoidable 429s (by scope %v); want none", st.Avoidable, st.ByScope)
	}
	if st.Banned || st.BannedResponses > 0 {
		t.Errorf("the emulator banned the processes (%d banned responses)", st.BannedResponses)
	}
	// Generous lower bounds: the load must have run at all, on both limits.
	if bucket < mpLimit {
		t.Errorf("%d successes on the shared channel; want at least %d", bucket, mpLimit)
	}
	if ok := st.ByStatus[http.StatusOK]; ok < mpGlobal {
		t.Errorf("%d successes in all; want at least %d", ok, mpGlobal)
	}
}

// TestMultiProcessWorker is the body of a worker process of
// TestMultiProcess; it skips when run otherwise.
func TestMultiProcessWorker(t *testing.T) {
	worker := os.Getenv(envWorker)
	if worker == "" {
		t.Skip("a worker process of TestMultiProcess")
	}
	client := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	t.Cleanup(func() { client.Close() })
	s := redisstore.New(client, redisstore.WithPrefix(os.Getenv(envPrefix)), redisstore.WithFailurePolicy(redisstore.FailClosed),
		redisstore.WithPolicy(store.Policy{GlobalLimit: mpGlobal}))
	t.Cleanup(func() { s.Close() })
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	tr := ratecord.NewTransport(base, ratecord.WithStore(s))
	t.Cleanup(func() { tr.Close() })
	hc := &http.Client{Transport: tr}
	api := os.Getenv(envAPI)

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(mpDuration, cancel)
	defer cancel()
	send := func(channel int) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", fmt.Sprintf("%s/channels/%d/messages", api, channel), strings.NewReader(`{"content":"hi"}`))
		req.Header.Set("Authorization", mpToken)
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return nil
	}
	var wg sync.WaitGroup
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				channel := 1 // the shared bucket
				if g%2 == 1 {
					channel = 100 + (g*7+i)%100 // fan-out: the global limit binds
				}
				if err := send(channel); err != nil && ctx.Err() == nil {
					t.Errorf("worker %s: POST /channels/%d/messages = %v", worker, channel, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
