package ratecord_test

import (
	"fmt"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jarcoal/httpmock"
)

// fakeDiscord answers through httpmock like Discord's rate limiter would:
// counters per (Authorization, bucket hash, major parameter), fixed or
// sliding windows, announced in headers. It records what it saw.
type fakeDiscord struct {
	mu          sync.Mutex // guards everything below
	counters    map[string]*fakeCounter
	sent        []sentRequest
	n429        int
	inflight    int
	maxInflight int
	delay       time.Duration
}

type sentRequest struct {
	at     time.Time
	route  string
	auth   string
	status int
}

type fakeCounter struct {
	limit   int
	window  time.Duration
	sliding bool
	start   time.Time // fixed: window start
	count   int       // fixed: requests in window
	level   float64   // sliding: bucket level
	last    time.Time // sliding: last drain
}

func newFakeDiscord() *fakeDiscord {
	return &fakeDiscord{counters: make(map[string]*fakeCounter)}
}

// major returns the major parameter of a path like /api/v10/channels/1/...
func major(path string) string {
	p := strings.TrimPrefix(path, "/api/v10/")
	parts := strings.SplitN(p, "/", 3)
	if len(parts) >= 2 {
		return parts[0] + "/" + parts[1]
	}
	return p
}

// take tries to count a request; it returns the headers to send and, when
// the bucket is exhausted, the retry-after.
func (c *fakeCounter) take(now time.Time) (remaining int, resetAfter time.Duration, ok bool) {
	if c.sliding {
		if !c.last.IsZero() {
			c.level = math.Max(0, c.level-now.Sub(c.last).Seconds()*float64(c.limit)/c.window.Seconds())
		}
		c.last = now
		per := time.Duration(float64(c.window) / float64(c.limit))
		if c.level+1 > float64(c.limit)+1e-9 {
			return 0, time.Duration(c.level * float64(per)), false
		}
		c.level++
		return int(float64(c.limit) - c.level), time.Duration(c.level * float64(per)), true
	}
	if c.start.IsZero() || now.Sub(c.start) >= c.window {
		c.start, c.count = now, 0
	}
	resetAfter = c.window - now.Sub(c.start)
	if c.count >= c.limit {
		return 0, resetAfter, false
	}
	c.count++
	return c.limit - c.count, resetAfter, true
}

// bucket returns a responder enforcing limit per window on bucket hash.
func (f *fakeDiscord) bucket(hash string, limit int, window time.Duration, sliding bool) httpmock.Responder {
	return func(r *http.Request) (*http.Response, error) {
		f.enter()
		defer f.leave()
		f.mu.Lock()
		defer f.mu.Unlock()
		now := time.Now()
		key := r.Header.Get("Authorization") + "|" + hash + "|" + major(r.URL.Path)
		c := f.counters[key]
		if c == nil {
			c = &fakeCounter{limit: limit, window: window, sliding: sliding}
			f.counters[key] = c
		}
		remaining, resetAfter, ok := c.take(now)
		status := 200
		var resp *http.Response
		if ok {
			resp = httpmock.NewStringResponse(200, `{"id":"1"}`)
		} else {
			status = 429
			f.n429++
			resp = httpmock.NewStringResponse(429, fmt.Sprintf(`{"message":"You are being rate limited.","retry_after":%.3f,"global":false}`, resetAfter.Seconds()))
			resp.Header.Set("Retry-After", fmt.Sprint(int(math.Ceil(resetAfter.Seconds()))))
			resp.Header.Set("X-RateLimit-Scope", "user")
		}
		resp.Header.Set("X-RateLimit-Limit", fmt.Sprint(c.limit))
		resp.Header.Set("X-RateLimit-Remaining", fmt.Sprint(remaining))
		resp.Header.Set("X-RateLimit-Reset-After", fmt.Sprintf("%.3f", resetAfter.Seconds()))
		resp.Header.Set("X-RateLimit-Bucket", hash)
		f.sent = append(f.sent, sentRequest{at: now, route: r.Method + " " + r.URL.Path, auth: r.Header.Get("Authorization"), status: status})
		return resp, nil
	}
}

// setLimit changes the limit of every counter of a hash, as Discord may do
// mid-window.
func (f *fakeDiscord) setLimit(limit int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.counters {
		c.limit = limit
	}
}

// plain returns a responder with the given status and headers, recording
// the request.
func (f *fakeDiscord) plain(status int, body string, header ...string) httpmock.Responder {
	return func(r *http.Request) (*http.Response, error) {
		f.enter()
		defer f.leave()
		f.mu.Lock()
		f.sent = append(f.sent, sentRequest{at: time.Now(), route: r.Method + " " + r.URL.Path, auth: r.Header.Get("Authorization"), status: status})
		if status == 429 {
			f.n429++
		}
		f.mu.Unlock()
		resp := httpmock.NewStringResponse(status, body)
		for i := 0; i+1 < len(header); i += 2 {
			resp.Header.Set(header[i], header[i+1])
		}
		return resp, nil
	}
}

func (f *fakeDiscord) enter() {
	f.mu.Lock()
	f.inflight++
	f.maxInflight = max(f.maxInflight, f.inflight)
	d := f.delay
	f.mu.Unlock()
	if d > 0 {
		time.Sleep(d)
	}
}

func (f *fakeDiscord) leave() {
	f.mu.Lock()
	f.inflight--
	f.mu.Unlock()
}

func (f *fakeDiscord) stats() (sent []sentRequest, n429, maxInflight int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]sentRequest(nil), f.sent...), f.n429, f.maxInflight
}

// count returns how many requests matching re were answered with status.
func (f *fakeDiscord) count(re interface{ MatchString(string) bool }, status int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.sent {
		if s.status == status && re.MatchString(s.route) {
			n++
		}
	}
	return n
}
