package memstore_test

import (
	"fmt"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
)

// answer is a base RoundTripper that answers every request at once with
// 200 and the rate-limit headers of a bucket of 5 per second, named by
// bucket.
type answer struct{ bucket func(*http.Request) string }

func (a answer) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "5")
	h.Set("X-RateLimit-Remaining", "4")
	h.Set("X-RateLimit-Reset-After", "1.000")
	h.Set("X-RateLimit-Bucket", a.bucket(req))
	return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: req}, nil
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// budget is the most heap a million distinct values may hold through one
// Transport.
const budget = 64 << 20

// memoryRun sends n requests through one Transport on a store with a fake
// clock that advances step after each, checking the heap after GC at ten
// checkpoints against budget. Fewer than a million values are held to the
// same bound per value: the budget, the store's bound and the pace all
// scale with n. It then lets the store idle past every TTL and checks that
// the heap falls back and the store is empty. It returns the growth seen at
// each checkpoint.
func memoryRun(t *testing.T, n int, step time.Duration, pol store.Policy, req func(i int) *http.Request, base http.RoundTripper) []uint64 {
	t.Helper()
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	step = step * 1_000_000 / time.Duration(n)
	st := memstore.New(memstore.WithClock(clk), memstore.WithMaxEntries(memstore.DefaultMaxEntries*n/1_000_000), memstore.WithPolicy(pol))
	defer st.Close()
	tr := ratecord.NewTransport(base, ratecord.WithStore(st))
	defer tr.Close()

	limit := uint64(budget) * uint64(n) / 1_000_000
	before := heap()
	var seen []uint64
	for i := range n {
		resp, err := tr.RoundTrip(req(i))
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
		clk.Advance(step)
		if (i+1)%(n/10) == 0 {
			grown := heap() - min(before, heap())
			creds, routes, buckets := st.Entries()
			folds, held := st.Folded()
			t.Logf("after %7d values: heap +%5.1f MB (%d bytes per value); %d credentials, %d routes, %d buckets held; %d folded, %d of them holding their buckets",
				i+1, float64(grown)/(1<<20), grown/uint64(i+1), creds, routes, buckets, folds, held)
			seen = append(seen, grown)
			if grown > limit {
				t.Fatalf("after %d values the heap grew by %.1f MB; want at most %.1f MB", i+1, float64(grown)/(1<<20), float64(limit)/(1<<20))
			}
		}
	}

	// Idle past the route TTL: the sweep timer collects everything. (Each
	// minute, wait for the timer's sweep to have run and armed the next.)
	empty := func() bool {
		creds, routes, buckets := st.Entries()
		folds, _ := st.Folded()
		return creds+routes+buckets+folds == 0
	}
	for range 62 {
		clk.Advance(time.Minute)
		for deadline := time.Now().Add(10 * time.Second); clk.Timers() == 0 && !empty(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no sweep timer armed while the store holds state")
			}
		}
	}
	if !empty() {
		creds, routes, buckets := st.Entries()
		folds, _ := st.Folded()
		t.Fatalf("after idling an hour the store holds %d credentials, %d routes, %d buckets, %d folded; want none",
			creds, routes, buckets, folds)
	}
	grown := heap() - min(before, heap())
	t.Logf("after idling: heap +%.1f MB", float64(grown)/(1<<20))
	if grown > 4<<20 {
		t.Errorf("after idling the heap is still %.1f MB above where it started; want under 4 MB", float64(grown)/(1<<20))
	}
	return seen
}

func values(t *testing.T) int {
	if testing.Short() || raceEnabled {
		return 100_000
	}
	return 1_000_000
}

// TestMemoryDistinctCredentials sends each request with an Authorization
// header of its own, 10,000 new credentials per second (for a million).
func TestMemoryDistinctCredentials(t *testing.T) {
	n := values(t)
	req := func(i int) *http.Request {
		r, _ := http.NewRequest("POST", "https://discord.com/api/v10/channels/1/messages", http.NoBody)
		r.Header.Set("Authorization", "Bot credential-"+strconv.Itoa(i))
		return r
	}
	base := answer{func(*http.Request) string { return "h" }}
	var peaks [2]uint64
	for i, tc := range []struct {
		name string
		pol  store.Policy
	}{
		{"default", store.Policy{}},
		{"global limit 20000", store.Policy{GlobalLimit: 20000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			peaks[i] = slices.Max(memoryRun(t, n, 100*time.Microsecond, tc.pol, req, base))
		})
	}
	if peaks[1] > peaks[0]+peaks[0]/8 {
		t.Errorf("with a global limit of 20000 the heap grew by %.1f MB, with the default %.1f MB; want no more",
			float64(peaks[1])/(1<<20), float64(peaks[0])/(1<<20))
	}
}

// perWindow is the most a credential may cost while one request of it
// counts in its open global window, once the store holds more than its
// bound.
const perWindow = 256

// TestMemoryBurst sends each request with an Authorization header of its
// own on a clock that does not move: every credential keeps a request in
// its open global window to the end, as at any rate too fast for a window
// to pass. (The Transport over this store goes at about 30,000 requests a
// second on one core: then some 30,000 are in one window.) The heap stays
// within budget, and each credential beyond the store's bound costs at
// most perWindow bytes, whether its bucket has slots left or none.
func TestMemoryBurst(t *testing.T) {
	n := values(t)
	req := func(i int) *http.Request {
		r, _ := http.NewRequest("POST", "https://discord.com/api/v10/channels/1/messages", http.NoBody)
		r.Header.Set("Authorization", "Bot credential-"+strconv.Itoa(i))
		return r
	}
	for _, tc := range []struct {
		name string
		base http.RoundTripper
	}{
		{"slots left", answer{func(*http.Request) string { return "h" }}},
		{"bucket exhausted", exhausted{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seen := memoryRun(t, n, 0, store.Policy{}, req, tc.base)
			first, last := seen[0], seen[len(seen)-1]
			per := (max(last, first) - first) / uint64(n-n/10)
			t.Logf("%d bytes per credential in its window beyond the first tenth", per)
			if per > perWindow {
				t.Errorf("each credential with a request in its open global window costs %d bytes; want at most %d", per, perWindow)
			}
		})
	}
}

// exhausted is a base RoundTripper that answers every request at once with
// 200 and the rate-limit headers of a bucket of one per second, spent.
type exhausted struct{}

func (exhausted) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "1")
	h.Set("X-RateLimit-Remaining", "0")
	h.Set("X-RateLimit-Reset-After", "1.000")
	h.Set("X-RateLimit-Bucket", "x")
	return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: req}, nil
}

// TestMemoryDistinctRoutes sends each request of one credential on a route
// of its own (a literal path segment keying does not recognise), each with
// a bucket of its own, 50 per second (the global limit).
func TestMemoryDistinctRoutes(t *testing.T) {
	n := values(t)
	req := func(i int) *http.Request {
		r, _ := http.NewRequest("GET", "https://discord.com/api/v10/guilds/1/w"+strconv.Itoa(i), http.NoBody)
		r.Header.Set("Authorization", "Bot one-credential")
		return r
	}
	base := answer{func(r *http.Request) string { return fmt.Sprint(len(r.URL.Path), r.URL.Path[len(r.URL.Path)-3:]) }}
	memoryRun(t, n, 20*time.Millisecond, store.Policy{}, req, base)
}
