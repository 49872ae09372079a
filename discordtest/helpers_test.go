package discordtest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeClock is a clock that moves only when told, with timers that fire
// when it moves past them.
type fakeClock struct {
	mu     sync.Mutex // guards t and timers
	t      time.Time
	timers []*fakeTimer
}

// fakeTimer is a timer of a fakeClock.
type fakeTimer struct {
	at time.Time
	c  chan time.Time // buffered: firing never blocks
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d and fires the timers that are due.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	kept := c.timers[:0]
	for _, ft := range c.timers {
		if ft.at.After(c.t) {
			kept = append(kept, ft)
			continue
		}
		ft.c <- c.t
	}
	c.timers = kept
}

// Timer is the fake clock's time.NewTimer: a channel and a stop function.
func (c *fakeClock) Timer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ft := &fakeTimer{at: c.t.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, ft)
	return ft.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.timers {
			if x == ft {
				c.timers = append(c.timers[:i], c.timers[i+1:]...)
				return true
			}
		}
		return false
	}
}

// Pending returns how many timers wait for the clock to move.
func (c *fakeClock) Pending() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// waitUntil polls cond until it holds: it synchronises a test with
// goroutines that react to the fake clock and asserts nothing about speed.
// The test's own timeout bounds it.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if t.Context().Err() != nil {
			t.Fatalf("gave up waiting until %s", what)
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// startTime is the fake clock's start: 2023-11-14 22:13:20 UTC.
func startTime() time.Time { return time.Unix(1700000000, 0) }

// harness is an emulator with its own client.
type harness struct {
	t      *testing.T
	srv    *Server
	clock  *fakeClock // nil on the real clock
	client *http.Client
}

// newHarness starts an emulator on a fake clock.
func newHarness(t *testing.T, opts ...Option) *harness {
	t.Helper()
	clk := &fakeClock{t: startTime()}
	h := startHarness(t, append([]Option{withClock(clk.Now), withTimer(clk.Timer)}, opts...))
	h.clock = clk
	return h
}

// newRealHarness starts an emulator on the real clock.
func newRealHarness(t *testing.T, opts ...Option) *harness {
	t.Helper()
	return startHarness(t, opts)
}

func startHarness(t *testing.T, opts []Option) *harness {
	t.Helper()
	srv, err := Start(opts...)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(srv.Close)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &harness{t: t, srv: srv, client: &http.Client{Transport: tr}}
}

// reply is a response read in full.
type reply struct {
	status int
	header http.Header
	body   []byte
}

// do sends one request; auth "" sends no Authorization header.
func (h *harness) do(method, path, auth, body string) *reply {
	h.t.Helper()
	return h.doFrom("", method, path, auth, body)
}

// doFrom sends one request from the process named proc ([ProcessHeader]);
// proc "" sends no process header.
func (h *harness) doFrom(proc, method, path, auth, body string) *reply {
	h.t.Helper()
	return h.doWith(proc, nil, method, path, auth, body)
}

// doWith is doFrom with the headers extra added to the request.
func (h *harness) doWith(proc string, extra http.Header, method, path, auth, body string) *reply {
	h.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(h.t.Context(), method, h.srv.URL()+path, rd)
	if err != nil {
		h.t.Fatalf("NewRequest: %v", err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if proc != "" {
		req.Header.Set(ProcessHeader, proc)
	}
	for k, vs := range extra {
		req.Header[k] = vs
	}
	resp, err := h.client.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatalf("%s %s: reading body: %v", method, path, err)
	}
	return &reply{status: resp.StatusCode, header: resp.Header, body: data}
}

// serve answers one request directly through ServeHTTP, from remoteAddr.
func serve(s *Server, method, path, auth, remoteAddr string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, nil)
	req.RemoteAddr = remoteAddr
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	return rec
}

// want checks the status and headers of a reply; a want value of "" means the
// header must be absent.
func (r *reply) want(t *testing.T, status int, headers ...string) {
	t.Helper()
	if r.status != status {
		t.Fatalf("status = %d; want %d (body %s)", r.status, status, r.body)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		name, want := headers[i], headers[i+1]
		got, ok := r.header[http.CanonicalHeaderKey(name)]
		switch {
		case want == "" && ok:
			t.Errorf("header %s = %q; want it absent", name, got)
		case want != "" && r.header.Get(name) != want:
			t.Errorf("header %s = %q; want %q", name, r.header.Get(name), want)
		}
	}
}

// rateLimitBody decodes a 429 body.
func (r *reply) rateLimitBody(t *testing.T) (retryAfter float64, global bool, raw string) {
	t.Helper()
	var b struct {
		Message    string   `json:"message"`
		RetryAfter *float64 `json:"retry_after"`
		Global     *bool    `json:"global"`
	}
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatalf("429 body %s: %v", r.body, err)
	}
	if b.Message != "You are being rate limited." || b.RetryAfter == nil || b.Global == nil {
		t.Fatalf("429 body = %s; want message, retry_after and global", r.body)
	}
	return *b.RetryAfter, *b.Global, string(r.body)
}

// noBucketHeaders lists the bucket headers as absent, for want.
func noBucketHeaders() []string {
	var hs []string
	for _, h := range []string{
		"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
		"X-RateLimit-Reset-After", "X-RateLimit-Bucket",
	} {
		hs = append(hs, h, "")
	}
	return hs
}
