package discordtest

import (
	"fmt"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"
)

// netHarness is an emulator, not listening, whose clock and network timers
// are fake, with requests served through ServeHTTP in goroutines.
type netHarness struct {
	t     *testing.T
	srv   *Server
	clock *fakeClock
	mu    sync.Mutex // guards sent, answered and done
	sent  int
	// answered counts the requests answered; done holds when the last
	// request to each path was.
	answered int
	done     map[string]time.Time
	wg       sync.WaitGroup
}

func newNetHarness(t *testing.T, opts ...Option) *netHarness {
	t.Helper()
	clk := &fakeClock{t: startTime()}
	s, err := newServer(append([]Option{withClock(clk.Now), withTimer(clk.Timer)}, opts...))
	if err != nil {
		t.Fatal(err)
	}
	h := &netHarness{t: t, srv: s, clock: clk, done: map[string]time.Time{}}
	t.Cleanup(func() {
		// Every request in flight ends once its delays have passed.
		for h.finished() < h.started() {
			clk.Advance(time.Second)
			time.Sleep(100 * time.Microsecond)
		}
		h.wg.Wait()
		s.Close()
	})
	return h
}

// send starts a POST to path from botA; the returned channel receives the
// response once it is written. The goroutine ends when the request's delays
// have passed, which the test's cleanup makes sure of.
func (h *netHarness) send(path string) <-chan *httptest.ResponseRecorder {
	c := make(chan *httptest.ResponseRecorder, 1)
	h.mu.Lock()
	h.sent++
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		rec := serve(h.srv, "POST", path, botA, "192.0.2.1:1234")
		h.mu.Lock()
		h.done[path] = h.clock.Now()
		h.answered++
		h.mu.Unlock()
		c <- rec
	}()
	return c
}

// finished returns how many requests have been answered.
func (h *netHarness) finished() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.answered
}

// started returns how many requests have been sent.
func (h *netHarness) started() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.sent
}

// settle waits until every one of n requests sent is waiting on a network
// timer or has been answered, and the emulator has decided decided of them.
func (h *netHarness) settle(n, decided int) {
	h.t.Helper()
	waitUntil(h.t, fmt.Sprintf("%d requests settle with %d decided", n, decided), func() bool {
		return h.clock.Pending()+h.finished() == n && h.srv.Stats().Requests == decided
	})
}

func TestArrivalIsTheDecision(t *testing.T) {
	t.Parallel()
	// Every request takes 10 ms to reach the emulator and 1.005 s for its
	// response to come back.
	h := newNetHarness(t, WithoutDefaultTable(),
		WithBuckets(Bucket{Hash: "h", Limit: 1, Window: 100 * time.Millisecond, Fixed: true}),
		WithRoutes(Route{Template: "POST /channels/{channel_id}/messages", Bucket: "h"}),
		WithNetwork(Network{
			Up:   Leg{Base: 10 * time.Millisecond},
			Down: Leg{Base: 5 * time.Millisecond, StallEvery: 1, Stall: time.Second},
		}))
	const path = "/api/v10/channels/1/messages"
	t0 := startTime()
	ms := time.Millisecond

	a := h.send(path) // sent at 0, arrives at 10 ms, answered at 1015 ms
	h.settle(1, 0)
	h.clock.Advance(10 * ms)
	h.settle(1, 1)
	if got := h.srv.Stats().Log[0].Time; !got.Equal(t0.Add(10 * ms)) {
		t.Fatalf("first request logged at %v; want its arrival, %v", got.Sub(t0), 10*ms)
	}

	h.clock.Advance(40 * ms)
	b := h.send(path) // sent at 50 ms, arrives at 60 ms: the window is full
	h.settle(2, 1)
	h.clock.Advance(10 * ms)
	h.settle(2, 2)

	h.clock.Advance(35 * ms)
	d := h.send(path) // sent at 95 ms, arrives at 105 ms, 5 ms before the window ends
	h.settle(3, 2)
	h.clock.Advance(5 * ms)
	c := h.send(path) // sent at 100 ms, arrives at 110 ms, as the window ends
	h.settle(4, 2)
	h.clock.Advance(5 * ms)
	h.settle(4, 3)
	h.clock.Advance(5 * ms)
	h.settle(4, 4)
	if n := h.finished(); n != 0 {
		t.Fatalf("%d responses written before their way down passed; want 0", n)
	}

	log := h.srv.Stats().Log
	want := []struct {
		at     time.Duration
		status int
	}{{10 * ms, 200}, {60 * ms, 429}, {105 * ms, 429}, {110 * ms, 200}}
	for i, w := range want {
		e := log[i]
		if !e.Time.Equal(t0.Add(w.at)) || e.Status != w.status || e.Avoidable {
			t.Errorf("log[%d] = %v at %v (avoidable %v); want %d at %v, unavoidable: no response had reached the client",
				i, e.Status, e.Time.Sub(t0), e.Avoidable, w.status, w.at)
		}
	}

	h.clock.Advance(2 * time.Second)
	ra, rb, rd, rc := <-a, <-b, <-d, <-c
	if got := ra.Header().Get("X-RateLimit-Reset-After"); ra.Code != 200 || got != "0.100" {
		t.Errorf("first response %d, Reset-After %q; want 200, 0.100 (the window opened at its arrival)", ra.Code, got)
	}
	if rb.Code != 429 || rc.Code != 200 {
		t.Errorf("responses %d, %d; want 429, 200", rb.Code, rc.Code)
	}
	// The window ends 100 ms after the first request arrived, not after it
	// was sent (that would be 100 ms, and the request arriving at 105 ms
	// would pass) nor after its response (1115 ms).
	if got := rd.Header().Get("X-RateLimit-Reset-After"); rd.Code != 429 || got != "0.005" {
		t.Errorf("request arriving at 105 ms: %d, Reset-After %q; want 429, 0.005", rd.Code, got)
	}
}

func TestResponsesOvertake(t *testing.T) {
	t.Parallel()
	leg := Leg{Base: time.Millisecond, Jitter: 60 * time.Millisecond}
	h := newNetHarness(t, WithSeed(1), WithNetwork(Network{Up: leg, Down: leg}))
	const n = 8
	for i := range n {
		h.send(fmt.Sprintf("/api/v10/channels/%d/messages", i))
	}
	h.settle(n, 0)
	for step := 0; h.finished() < n; step++ {
		if step > 200 {
			t.Fatalf("%d of %d requests answered after 200 ms; want all", h.finished(), n)
		}
		h.clock.Advance(time.Millisecond)
		waitUntil(t, "the requests settle", func() bool { return h.clock.Pending()+h.finished() == n })
	}

	decided := map[string]time.Time{}
	for _, e := range h.srv.Stats().Log {
		decided[e.Major] = e.Time
	}
	var byArrival []string
	for i := range n {
		byArrival = append(byArrival, fmt.Sprintf("channels/%d", i))
	}
	slices.SortFunc(byArrival, func(x, y string) int { return decided[x].Compare(decided[y]) })
	h.mu.Lock()
	defer h.mu.Unlock()
	overtaken := 0
	for i, x := range byArrival {
		for _, y := range byArrival[i+1:] {
			ax, ay := h.done["/api/v10/"+x+"/messages"], h.done["/api/v10/"+y+"/messages"]
			if decided[x].Before(decided[y]) && ay.Before(ax) {
				overtaken++
			}
		}
	}
	if overtaken == 0 {
		t.Errorf("responses came back in the order the requests arrived; want some to overtake others")
	}
}

func TestSeededDelays(t *testing.T) {
	t.Parallel()
	draws := func(seed uint64, opts ...Option) [][2]time.Duration {
		s, err := newServer(append([]Option{WithNetwork(StallsNetwork()), WithSeed(seed)}, opts...))
		if err != nil {
			t.Fatal(err)
		}
		var out [][2]time.Duration
		for range 2000 {
			up, down := s.delays.draw()
			out = append(out, [2]time.Duration{up, down})
		}
		return out
	}
	a, b, other := draws(7), draws(7), draws(8)
	if !slices.Equal(a, b) {
		t.Errorf("two emulators seeded 7 drew different delays")
	}
	if slices.Equal(a, other) {
		t.Errorf("seeds 7 and 8 drew the same delays")
	}
	ms := time.Millisecond
	stalls := 0
	for _, p := range a {
		for _, d := range p {
			if d >= 2*time.Second {
				stalls++
				d -= 2 * time.Second
			}
			if d < 10*ms || d > 75*ms {
				t.Fatalf("delay %v; want 10 ms to 75 ms, plus 2 s when stalled", d)
			}
		}
	}
	if stalls == 0 || stalls > 60 {
		t.Errorf("%d stalls in 4000 legs; want about 20 (one in 200)", stalls)
	}
	for _, p := range draws(7, WithTimeScale(0.1)) {
		for _, d := range p {
			if d >= 200*ms {
				d -= 200 * ms
			}
			if d < ms || d > 7500*time.Microsecond {
				t.Fatalf("scaled delay %v; want 1 ms to 7.5 ms, plus 0.2 s when stalled", d)
			}
		}
	}
}

func TestNetworkProfile(t *testing.T) {
	t.Parallel()
	for _, name := range NetworkProfiles() {
		if _, ok := NetworkProfile(name); !ok {
			t.Errorf("NetworkProfile(%q) unknown; want the profile NetworkProfiles lists", name)
		}
	}
	if _, ok := NetworkProfile("moon"); ok {
		t.Errorf("NetworkProfile(%q) known; want unknown", "moon")
	}
	tests := []struct {
		name string
		want time.Duration
	}{{ProfileLAN, 2 * time.Millisecond}, {ProfileDiscord, 150 * time.Millisecond}, {ProfileStalls, 150 * time.Millisecond}}
	for _, tt := range tests {
		n, _ := NetworkProfile(tt.name)
		if got := n.MaxRoundTrip(); got != tt.want {
			t.Errorf("NetworkProfile(%q).MaxRoundTrip() = %v; want %v", tt.name, got, tt.want)
		}
	}
}
