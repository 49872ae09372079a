package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestProxyMemoryDistinctTokens forwards requests with 40,000 distinct
// 60-byte bot tokens (10,000 in short mode) through a proxy with default
// flags, on the real clock, and checks the heap after GC: the memory
// store keeps a bounded number of credentials however many tokens pass.
// (Before the bound, 30,000 tokens held 73 MB; now 40,000, or 160,000, hold
// about 26 MB.) Then, but in short mode, it lets the proxy idle and checks
// that the heap after GC falls back near where it started within a minute:
// the store forgets credentials idle for seconds beyond a small share of
// its bound. (Before, 40,000 tokens still held 22 MB after a minute idle.)
// The same holds with -redis: the Redis store forgets the routes of
// credentials idle for 25 to 50 s. (Before, it kept up to 65,536 of them,
// 17 MB, for good.)
func TestProxyMemoryDistinctTokens(t *testing.T) {
	t.Run("memory", func(t *testing.T) { proxyMemory(t, nil) })
	t.Run("redis", func(t *testing.T) { proxyMemory(t, []string{"-redis", redisServer(t)}) })
}

func proxyMemory(t *testing.T, flags []string) {
	n := 40_000
	if testing.Short() {
		n = 10_000
	}
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Limit", "5")
		w.Header().Set("X-RateLimit-Remaining", "4")
		w.Header().Set("X-RateLimit-Reset-After", "1.000")
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		io.WriteString(w, `{"id":"42"}`)
	}))
	t.Cleanup(upstream.Close)
	cfg, err := parseProxyFlags(append([]string{"-upstream", upstream.URL}, flags...), io.Discard, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProxy(cfg, newProxyLogger(io.Discard, cfg))
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()

	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	pad := strings.Repeat("x", 60)
	for i := range n {
		r := httptest.NewRequest("GET", "/api/v10/users/@me", nil)
		tok := fmt.Sprintf("%d.", i)
		r.Header.Set("Authorization", "Bot "+tok+pad[len(tok):])
		w := httptest.NewRecorder()
		p.ServeHTTP(w, r)
		if w.Code != 200 {
			t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
		}
		if (i+1)%(n/4) == 0 {
			grown := heap() - min(before, heap())
			t.Logf("after %d tokens: heap +%.1f MB", i+1, float64(grown)/(1<<20))
			if grown > 64<<20 {
				t.Fatalf("after %d distinct tokens the heap grew by %.1f MB; want at most 64 MB", i+1, float64(grown)/(1<<20))
			}
		}
	}
	if testing.Short() {
		return
	}
	// The heap the store holds for the tokens (tens of megabytes) goes; what
	// stays is the Transport's bounded caches and the store's idle share.
	const near = 4 << 20
	start := time.Now()
	for {
		time.Sleep(time.Second)
		grown := heap() - min(before, heap())
		idle := time.Since(start)
		if grown <= near {
			t.Logf("after %v idle: heap +%.1f MB", idle.Round(time.Second), float64(grown)/(1<<20))
			break
		}
		if idle > time.Minute {
			t.Fatalf("after a minute idle the heap is %.1f MB above where it started; want at most %.0f MB",
				float64(grown)/(1<<20), float64(near)/(1<<20))
		}
	}
}
