package redisstore_test

import (
	"net/http"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store/redisstore"
)

// answer is a base RoundTripper that answers every request at once with
// 200 and the headers of a bucket of 5 per second with slots left.
type answer struct{}

func (answer) RoundTrip(req *http.Request) (*http.Response, error) {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "5")
	h.Set("X-RateLimit-Remaining", "4")
	h.Set("X-RateLimit-Reset-After", "1.000")
	h.Set("X-RateLimit-Bucket", "h")
	return &http.Response{StatusCode: 200, Header: h, Body: http.NoBody, Request: req}, nil
}

// footprint returns the heap after GC and the goroutine stacks in use: a
// session's driver costs its stack as well as its heap.
func footprint() (heap, stacks uint64) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc, m.StackInuse
}

// Memory bounds for many distinct credentials.
const (
	// burstBudget is the most heap and stack that a burst of distinct
	// credentials may add at any point.
	burstBudget = 64 << 20
	// perCredential is the most a credential may cost once its request
	// was answered, while the Store remembers its route.
	perCredential = 256
	// idleSlack is what may stay once the remembered routes have aged
	// out: the maps of sessions keep the size they grew to, and the
	// Transport its bounded caches.
	idleSlack = 4 << 20
)

// TestMemoryDistinctCredentials sends each request with an Authorization
// header of its own (100,000 of them; 20,000 in short or race mode) through
// one Transport on a Redis store, from 64 goroutines as fast as Redis
// answers. The Store's heap is its sessions, held by credentials with
// something to do or idle for a moment (bounded by the burst's rate once
// more than Crowd are held), and the routes it remembers (bounded by
// MaxAged entries): neither grows with the number of credentials beyond
// those bounds, which 100,000 credentials pass, so a burst of a million
// is held to the same budget. It checks the heap and stacks after GC at
// ten points, then what each remembered credential costs, then that
// aging gives the memory back.
func TestMemoryDistinctCredentials(t *testing.T) {
	n := 100_000
	if testing.Short() || raceEnabled {
		n = 20_000
	}
	const workers = 64
	client := newClient(t, redisAddr(t))
	st := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)))
	defer st.Close()
	tr := ratecord.NewTransport(answer{}, ratecord.WithStore(st))
	defer tr.Close()

	// The client's connections are not the Store's: open them first.
	var warm sync.WaitGroup
	for range workers {
		warm.Go(func() { client.Ping(t.Context()) })
	}
	warm.Wait()
	h0, s0 := footprint()
	grown := func() uint64 {
		h, s := footprint()
		return h - min(h, h0) + s - min(s, s0)
	}
	var wg sync.WaitGroup
	next := make(chan int)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, _ := http.NewRequest("POST", "https://discord.com/api/v10/channels/1/messages", http.NoBody)
				r.Header.Set("Authorization", "Bot credential-"+strconv.Itoa(i))
				resp, err := tr.RoundTrip(r)
				if err != nil {
					t.Errorf("request %d: %v", i, err)
					continue
				}
				resp.Body.Close()
			}
		}()
	}
	start := time.Now()
	most := 0
	for i := range n {
		next <- i
		if (i+1)%(n/10) != 0 {
			continue
		}
		g := grown()
		sessions, remembered := st.Held()
		most = max(most, sessions)
		t.Logf("%6v, %6d credentials: heap and stacks +%5.1f MB; %4d sessions, %5d routes remembered",
			time.Since(start).Round(time.Millisecond), i+1, float64(g)/(1<<20), sessions, remembered)
		if g > burstBudget {
			t.Fatalf("after %d credentials the heap and stacks grew by %.1f MB; want at most %d MB", i+1, float64(g)/(1<<20), burstBudget>>20)
		}
		if remembered > 2*redisstore.MaxAged {
			t.Fatalf("after %d credentials the Store remembers %d routes; want at most %d", i+1, remembered, 2*redisstore.MaxAged)
		}
	}
	close(next)
	wg.Wait()
	// Sessions are timing-bound, not count-bound: those working plus those
	// idle for crowdLinger (or a second while no more than Crowd are held).
	if most > 4*redisstore.Crowd {
		t.Errorf("the Store held up to %d sessions at once; want at most %d", most, 4*redisstore.Crowd)
	}

	// Once idle, every session ends within a second or so.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if sessions, _ := st.Held(); sessions == 0 {
			break
		}
		if time.Now().After(deadline) {
			sessions, _ := st.Held()
			t.Fatalf("10 s after the burst the Store still holds %d sessions; want none", sessions)
		}
	}
	withRoutes := grown()
	_, remembered := st.Held()
	st.Age()
	st.Age()
	aged := grown()
	if _, left := st.Held(); left != 0 {
		t.Fatalf("after aging twice the Store remembers %d routes; want none", left)
	}
	per := (withRoutes - min(withRoutes, aged)) / uint64(max(remembered, 1))
	t.Logf("idle: heap and stacks +%.1f MB with %d routes remembered (%d bytes each), +%.1f MB once they aged out",
		float64(withRoutes)/(1<<20), remembered, per, float64(aged)/(1<<20))
	if remembered == 0 {
		t.Fatal("the Store remembers no route after the burst; the test measures nothing")
	}
	if per > perCredential {
		t.Errorf("each credential the Store remembers costs %d bytes; want at most %d", per, perCredential)
	}
	if aged > idleSlack {
		t.Errorf("once idle and aged the heap and stacks are %.1f MB above where they started; want at most %d MB",
			float64(aged)/(1<<20), idleSlack>>20)
	}
}

// TestAgingForgetsIdleRoutes checks the timer that ages the remembered
// routes: a route not used for two periods is forgotten, one used every
// period is kept, and once nothing is remembered the timer stops.
func TestAgingForgetsIdleRoutes(t *testing.T) {
	const period = 500 * time.Millisecond
	defer redisstore.SetAgePeriod(period)()
	client := newClient(t, redisAddr(t))
	st := redisstore.New(client, redisstore.WithPrefix(testPrefix(t)))
	defer st.Close()
	tr := ratecord.NewTransport(answer{}, ratecord.WithStore(st))
	defer tr.Close()
	send := func(cred string) {
		t.Helper()
		r, _ := http.NewRequest("POST", "https://discord.com/api/v10/channels/1/messages", http.NoBody)
		r.Header.Set("Authorization", "Bot "+cred)
		resp, err := tr.RoundTrip(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	remembered := func() int {
		// A route is remembered once its report was applied in Redis.
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if _, r := st.Held(); r > 0 {
				return r
			}
		}
		return 0
	}
	send("idle")
	send("busy")
	if r := remembered(); r == 0 {
		t.Fatal("no route remembered after two requests")
	}
	// Keep "busy" in use, five times a period, for more than two periods:
	// "idle" goes, "busy" stays.
	for range 12 {
		time.Sleep(period / 5)
		send("busy")
	}
	_, r := st.Held()
	if r != 1 {
		t.Fatalf("after more than two periods with one credential in use the Store remembers %d routes; want 1", r)
	}
	// Then nothing: everything goes, and the timer does not run on.
	time.Sleep(3 * period)
	if _, r := st.Held(); r != 0 {
		t.Fatalf("three periods after the last request the Store remembers %d routes; want none", r)
	}
	if st.Aging() {
		t.Error("the aging timer is still armed with nothing to age")
	}
}
