package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/discordtest"
)

// redisAddr returns REDIS_ADDR once a server there answers. Without one it
// skips t, saying how to run it, or fails t when CI is "true": there, a
// missing Redis is a broken setup, not a reason to skip.
func redisAddr(t *testing.T) string {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	why := "REDIS_ADDR is not set"
	if addr != "" {
		c := redis.NewClient(&redis.Options{Addr: addr})
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		c.Close()
		if err == nil {
			return addr
		}
		why = fmt.Sprintf("PING %s: %v", addr, err)
	}
	msg := "no Redis for this test: set REDIS_ADDR to a server's address, such as REDIS_ADDR=127.0.0.1:6379 (" + why + ")"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

func TestIndexes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name             string
		part, parts, per int
		n                int
		want             []int
	}{
		{"one process runs all", 0, 1, 0, 5, []int{0, 1, 2, 3, 4}},
		{"process 1 of 3 runs its share", 1, 3, 0, 8, []int{1, 4, 7}},
		{"process 3 of 4, one goroutine in all", 3, 4, 0, 1, nil},
		{"worker 0 of G=4", 0, 16, 4, 100, []int{0, 1, 2, 3}},
		{"worker 5 of G=4", 5, 16, 4, 100, []int{20, 21, 22, 23}},
		{"worker 5, a group smaller than G", 5, 16, 4, 2, []int{20, 21}},
		{"worker 2, a group of one", 2, 16, 4, 1, []int{8}},
	}
	for _, tt := range tests {
		e := &Env{Part: tt.part, Parts: tt.parts, perWorker: tt.per}
		if got := e.indexes(tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Env{Part: %d, Parts: %d, perWorker: %d}.indexes(%d) = %v; want %v", tt.name, tt.part, tt.parts, tt.per, tt.n, got, tt.want)
		}
	}
}

// TestFixedLoadSplitsAcrossWorkers: the load groups of a scenario whose
// emulator bans after a number of requests into a block keep their size
// with workers: split across them as across processes, each goroutine run
// by one worker. Others run up to G goroutines in every worker.
func TestFixedLoadSplitsAcrossWorkers(t *testing.T) {
	t.Parallel()
	const workers, g = 4, 4
	fixed := map[string]bool{}
	n := discordtest.DiscordNetwork()
	for _, sc := range slices.Concat(Scenarios(n), Unannounced(n), Throughput(n)) {
		fixed[sc.Name] = sc.FixedLoad
	}
	for _, name := range []string{"edge-block", "html-429"} {
		if !fixed[name] {
			t.Errorf("%s: FixedLoad false; want its load groups split across workers", name)
		}
	}
	if fixed["saturate"] {
		t.Error("saturate: FixedLoad true; want its demand to grow with workers")
	}
	for _, tt := range []struct {
		fixed bool
		want  int // goroutines in all, of a load group of 6
	}{{true, 6}, {false, workers * g}} {
		seen := map[int]int{}
		for w := range workers {
			e := &Env{Part: w, Parts: workers, perWorker: Scenario{FixedLoad: tt.fixed}.perWorker(g)}
			for _, i := range e.indexes(6) {
				seen[i]++
			}
		}
		total := 0
		for i, n := range seen {
			total += n
			if n != 1 {
				t.Errorf("FixedLoad %v: goroutine %d run by %d workers; want 1", tt.fixed, i, n)
			}
		}
		if total != tt.want {
			t.Errorf("FixedLoad %v: %d goroutines of a group of 6 with %d workers of %d; want %d", tt.fixed, total, workers, g, tt.want)
		}
	}
}

func TestProcessTransport(t *testing.T) {
	t.Parallel()
	var seen http.Header
	tr := &processTransport{worker: "7", next: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = r.Header.Clone()
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	})}
	req, _ := http.NewRequest(http.MethodGet, "http://x/api/v10/users/@me", nil)
	req.Header.Set("Authorization", Bot)
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got := seen.Get(processHeader); got != "7" {
		t.Errorf("%s sent = %q; want %q", processHeader, got, "7")
	}
	if seen.Get("Authorization") != Bot {
		t.Errorf("Authorization sent = %q; want the caller's %q", seen.Get("Authorization"), Bot)
	}
	if got := req.Header.Get(processHeader); got != "" {
		t.Errorf("the caller's request got %s = %q; want it untouched", processHeader, got)
	}
}

// headerBook records, per value of processHeader, the requests that left
// for the emulator.
type headerBook struct {
	mu    sync.Mutex // guards seen
	seen  map[string]int
	total int
}

func (h *headerBook) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		h.mu.Lock()
		if h.seen == nil {
			h.seen = map[string]int{}
		}
		h.seen[r.Header.Get(processHeader)]++
		h.total++
		h.mu.Unlock()
		return next.RoundTrip(r)
	})
}

// workers returns the sorted header values seen.
func (h *headerBook) workers() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ws []string
	for w := range h.seen {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	return ws
}

// recording returns lim recording in book the worker header of what leaves
// for the emulator, at the HTTP transport under the base transport it is
// given, and appending every client it makes to clients.
func recording(lim Limiter, book *headerBook, mu *sync.Mutex, clients *[]Client) Limiter {
	inner := lim.New
	lim.New = func(base http.RoundTripper, cfg ClientConfig) Client {
		// The base is the order book's transport over the worker's mark
		// over the HTTP transport; the recorder goes in at the bottom.
		if ot, ok := base.(*orderTransport); ok {
			if pt, ok := ot.next.(*processTransport); ok {
				pt.next = book.wrap(pt.next)
			}
		}
		c := inner(base, cfg)
		mu.Lock()
		*clients = append(*clients, c)
		mu.Unlock()
		return c
	}
	return lim
}

// TestWorkersOwnRedisClients runs a scenario as three workers with
// ratecord-redis against a real Redis: each worker must have built its own
// go-redis client, store and transport and sent commands through its own
// client, each must mark its requests with its number, and the run must
// report the Redis figures.
func TestWorkersOwnRedisClients(t *testing.T) {
	addr := redisAddr(t)
	sc, err := pick(discordtest.LANNetwork(), "fan-out")
	if err != nil {
		t.Fatal(err)
	}
	var book headerBook
	var mu sync.Mutex
	var clients []Client
	lim := recording(RatecordRedis(RedisConfig{Addr: addr}), &book, &mu, &clients)
	const workers, per = 3, 2
	rs, err := Run(t.Context(), sc, []Limiter{lim}, Options{Duration: 800 * time.Millisecond, Network: discordtest.LANNetwork(),
		Workers: workers, Goroutines: per})
	if err != nil {
		t.Fatal(err)
	}
	if len(clients) != workers {
		t.Fatalf("%d clients made; want one per worker, %d", len(clients), workers)
	}
	rdbs, stores, trs := map[redis.UniversalClient]bool{}, map[any]bool{}, map[any]bool{}
	var sum int64
	for i, c := range clients {
		rc, ok := c.(*redisClient)
		if !ok {
			t.Fatalf("client %d is a %T; want a *redisClient", i, c)
		}
		rdbs[rc.rdb], stores[rc.store], trs[rc.tr] = true, true, true
		if n := rc.StoreCommands(); n == 0 {
			t.Errorf("client %d sent no command through its own Redis client", i)
		} else {
			sum += n
		}
	}
	if len(rdbs) != workers || len(stores) != workers || len(trs) != workers {
		t.Errorf("%d Redis clients, %d stores, %d transports among %d workers; want each its own", len(rdbs), len(stores), len(trs), workers)
	}
	if got, want := book.workers(), []string{"0", "1", "2"}; !slices.Equal(got, want) {
		t.Errorf("%s values sent = %v; want %v", processHeader, got, want)
	}
	r := rs[0]
	if r.Workers != workers || r.Goroutines != per || r.Procs != 1 {
		t.Errorf("result: workers %d, goroutines %d, procs %d; want %d, %d, 1", r.Workers, r.Goroutines, r.Procs, workers, per)
	}
	if r.StoreCommands != sum {
		t.Errorf("result counts %d commands sent; the clients' hooks %d", r.StoreCommands, sum)
	}
	if r.All2xx == 0 || r.StoreSeconds <= 0 || r.StoreExecuted == 0 || r.StoreCPU <= 0 {
		t.Errorf("result: %d 2xx, span %vs, %d commands executed, CPU %v; want all of them read", r.All2xx, r.StoreSeconds, r.StoreExecuted, r.StoreCPU)
	}
	if want := float64(r.StoreCommands) / float64(r.All2xx); r.StoreSentPer2xx != want {
		t.Errorf("sent/2xx = %v; want %d / %d = %v", r.StoreSentPer2xx, r.StoreCommands, r.All2xx, want)
	}
	if r.All2xx < r.Successes {
		t.Errorf("%d 2xx in all, fewer than the %d counted", r.All2xx, r.Successes)
	}
}

// TestProcsMarkTheirRequests runs a scenario as three worker "processes"
// (run in this process through Spawn, as the CLI runs them through exec):
// each marks its requests with its part.
func TestProcsMarkTheirRequests(t *testing.T) {
	t.Parallel()
	n := discordtest.LANNetwork()
	sc, err := pick(n, "shared-hash")
	if err != nil {
		t.Fatal(err)
	}
	var book headerBook
	var mu sync.Mutex
	var clients []Client
	lim := recording(Ratecord(), &book, &mu, &clients)
	spawn := func(ctx context.Context, run, _, _, url string, part, parts int, d time.Duration) (WorkerReport, error) {
		var out bytes.Buffer
		if err := RunWorker(ctx, run, sc[0], lim, url, part, parts, d, &out); err != nil {
			return WorkerReport{}, err
		}
		var rep WorkerReport
		err := json.Unmarshal(out.Bytes(), &rep)
		return rep, err
	}
	if _, err := Run(t.Context(), sc, []Limiter{lim}, Options{Duration: 600 * time.Millisecond, Network: n, Procs: 3, Spawn: spawn}); err != nil {
		t.Fatal(err)
	}
	if got, want := book.workers(), []string{"0", "1", "2"}; !slices.Equal(got, want) {
		t.Errorf("%s values sent = %v; want %v", processHeader, got, want)
	}
}

func TestWorkersFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-workers", "2", "-procs", "2"}, "exclusive"},
		{[]string{"-workers", "2", "-procs", "1"}, "exclusive"},
		{[]string{"-goroutines", "8"}, "-workers only"},
		{[]string{"-workers", "2", "-goroutines", "0"}, "at least 1"},
		{[]string{"-workers", "-1"}, "at least 1"},
	} {
		err := Main(t.Context(), append(tt.args, "-scenario", "saturate"), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Main(%q) = %v; want an error saying %q", tt.args, err, tt.want)
		}
	}
}

// TestWorkersTable runs the CLI with -workers and a memory store: the
// table names the workers and the goroutines each ran.
func TestWorkersTable(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	err := Main(t.Context(), []string{"-workers", "2", "-goroutines", "3", "-duration", "400ms", "-scenario", "shared-hash", "-limiters", "ratecord"},
		&out, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{" 2w ", "2 workers in this process", "up to 3 goroutines"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
