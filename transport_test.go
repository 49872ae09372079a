package ratecord_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jarcoal/httpmock"
	"go.uber.org/goleak"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const api = "https://discord.test/api/v10"

var (
	messagesRE = regexp.MustCompile(`/channels/\d+/messages$`)
	pinsRE     = regexp.MustCompile(`/channels/\d+/pins/\d+$`)
	channelRE  = regexp.MustCompile(`/channels/\d+$`)
)

// newClient returns a client whose transport is ratecord over mock.
func newClient(t *testing.T, mock http.RoundTripper, opts ...ratecord.Option) (*http.Client, *ratecord.Transport) {
	t.Helper()
	tr := ratecord.NewTransport(mock, opts...)
	t.Cleanup(func() { tr.Close() })
	return &http.Client{Transport: tr}, tr
}

func do(t *testing.T, c *http.Client, method, url, auth string) (*http.Response, error) {
	t.Helper()
	return doCtx(context.Background(), c, method, url, auth, nil)
}

func doCtx(ctx context.Context, c *http.Client, method, url, auth string, body []byte) (*http.Response, error) {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return nil, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, nil
}

// parallel runs n calls of f on as many goroutines and waits for them.
func parallel(n int, f func(i int)) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

// okResp returns a function that checks a response is a 200.
func okResp(t *testing.T) func(*http.Response, error) {
	return func(resp *http.Response, err error) { t.Helper(); mustOK(t, resp, err) }
}

func mustOK(t *testing.T, resp *http.Response, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("request failed: %v", err)
		return
	}
	if resp.StatusCode != 200 {
		t.Errorf("status %d; want 200", resp.StatusCode)
	}
}

func TestBucketRequestsGoConcurrently(t *testing.T) {
	t.Parallel()
	for _, sliding := range []bool{false, true} {
		t.Run(fmt.Sprintf("sliding=%v", sliding), func(t *testing.T) {
			t.Parallel()
			f := newFakeDiscord()
			f.delay = 20 * time.Millisecond
			mock := httpmock.NewMockTransport()
			mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("msg", 5, 250*time.Millisecond, sliding))
			c, _ := newClient(t, mock)
			parallel(20, func(int) { resp, err := do(t, c, "POST", api+"/channels/1/messages", "Bot a"); mustOK(t, resp, err) })
			_, n429, maxIn := f.stats()
			if n429 != 0 {
				t.Errorf("got %d 429s; want none", n429)
			}
			if maxIn < 4 || maxIn > 5 {
				t.Errorf("max requests in flight = %d; want 4 or 5 (the bucket's limit, less the first probe)", maxIn)
			}
		})
	}
}

func TestUnknownRouteSendsOneAtATime(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	release := make(chan struct{})
	var first atomic.Bool
	mock := httpmock.NewMockTransport()
	inner := f.bucket("msg", 10, time.Second, false)
	mock.RegisterRegexpResponder("POST", messagesRE, func(r *http.Request) (*http.Response, error) {
		if first.CompareAndSwap(false, true) {
			<-release
		}
		return inner(r)
	})
	c, _ := newClient(t, mock)
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := do(t, c, "POST", api+"/channels/1/messages", "Bot a")
			mustOK(t, resp, err)
		}()
	}
	time.Sleep(100 * time.Millisecond)
	if sent, _, _ := f.stats(); len(sent) != 0 || mock.GetTotalCallCount() != 1 {
		t.Fatalf("before the first response: %d calls reached the server; want 1", mock.GetTotalCallCount())
	}
	close(release)
	wg.Wait()
	if _, n429, _ := f.stats(); n429 != 0 {
		t.Errorf("got %d 429s; want none", n429)
	}
}

func TestRoutesSharingAHashShareACounter(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	shared := f.bucket("shared", 4, 300*time.Millisecond, false)
	mock.RegisterRegexpResponder("POST", messagesRE, shared)
	mock.RegisterRegexpResponder("PUT", pinsRE, shared)
	c, _ := newClient(t, mock)
	// Learn both routes first, then mix them.
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	okResp(t)(do(t, c, "PUT", api+"/channels/1/pins/5", "Bot a"))
	parallel(16, func(i int) {
		if i%2 == 0 {
			okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
		} else {
			okResp(t)(do(t, c, "PUT", api+"/channels/1/pins/5", "Bot a"))
		}
	})
	if _, n429, _ := f.stats(); n429 != 0 {
		t.Errorf("got %d 429s; want none", n429)
	}
}

func TestMajorParametersHaveTheirOwnCounters(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("msg", 2, 5*time.Second, false))
	c, _ := newClient(t, mock)
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	// Channel 1 is exhausted for five seconds; channel 2 and another
	// credential are not, so they go within the deadline.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, r := range []struct{ ch, auth string }{{"2", "Bot a"}, {"1", "Bot b"}} {
		resp, err := doCtx(ctx, c, "POST", api+"/channels/"+r.ch+"/messages", r.auth, nil)
		mustOK(t, resp, err)
	}
	_, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("channel 1 again: %v; want a deadline error", err)
	}
	if _, n429, _ := f.stats(); n429 != 0 {
		t.Errorf("got %d 429s; want none", n429)
	}
}

func TestRouteWithoutHeadersIsBoundByGlobalOnly(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	f.delay = 30 * time.Millisecond
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, f.plain(200, `{}`))
	c, _ := newClient(t, mock)
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a"))
	parallel(10, func(int) { okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a")) })
	if _, _, maxIn := f.stats(); maxIn < 5 {
		t.Errorf("max in flight = %d; want the requests to go concurrently", maxIn)
	}
}

func TestLimitChangesMidWindow(t *testing.T) {
	t.Parallel()
	for _, sliding := range []bool{false, true} {
		t.Run(fmt.Sprintf("sliding=%v", sliding), func(t *testing.T) {
			t.Parallel()
			f := newFakeDiscord()
			mock := httpmock.NewMockTransport()
			mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("msg", 6, 200*time.Millisecond, sliding))
			c, _ := newClient(t, mock)
			send := func(n int) {
				parallel(n, func(int) { okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a")) })
			}
			send(4)
			f.setLimit(2) // down, mid-window
			send(8)
			f.setLimit(9) // up
			send(20)
			// Lowering a limit below what the window already used cannot
			// be foreseen: the slots the old headers still announced (2
			// here) may each meet a 429, once. Nothing else may.
			if _, n429, _ := f.stats(); n429 > 2 {
				t.Errorf("got %d 429s; want at most the 2 the old limit still announced", n429)
			}
		})
	}
}

func TestGlobalLimit(t *testing.T) {
	t.Parallel()
	const limit, window = 10, 200 * time.Millisecond
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, f.plain(200, `{}`))
	c, _ := newClient(t, mock, ratecord.WithGlobalLimit(limit, window))
	parallel(45, func(i int) { okResp(t)(do(t, c, "GET", fmt.Sprintf("%s/channels/%d", api, i), "Bot a")) })
	// A webhook without Authorization has its own budget.
	okResp(t)(do(t, c, "GET", api+"/channels/1", ""))
	sent, _, _ := f.stats()
	var times []time.Time
	for _, s := range sent {
		if s.auth == "Bot a" {
			times = append(times, s.at)
		}
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	const slack = 10 * time.Millisecond // time between the grant and the fake's clock read
	for i := 0; i+limit < len(times); i++ {
		if d := times[i+limit].Sub(times[i]); d < window-slack {
			t.Fatalf("requests %d and %d are %v apart: %d requests in less than %v", i, i+limit, d, limit+1, window)
		}
	}
	// The first full burst went at once (well within one window).
	if d := times[limit-1].Sub(times[0]); d > window/2 {
		t.Errorf("the first %d requests took %v; want them as one burst", limit, d)
	}
}

func TestInteractionsAreExemptFromTheGlobalLimit(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", regexp.MustCompile(`/interactions/`), f.plain(204, ``))
	mock.RegisterRegexpResponder("GET", channelRE, f.plain(200, `{}`))
	c, _ := newClient(t, mock, ratecord.WithGlobalLimit(1, time.Hour))
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a")) // uses the whole global budget
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i := 0; i < 5; i++ {
		resp, err := doCtx(ctx, c, "POST", fmt.Sprintf("%s/interactions/%d/aW50ZXJhY3Rpb246tok%d/callback", api, 100+i, i), "Bot a", nil)
		if err != nil || resp.StatusCode != 204 {
			t.Fatalf("interaction callback %d: %v; want it exempt from the global limit", i, err)
		}
	}
}

func TestGlobal429PausesTheCredential(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	var once atomic.Bool
	ok := f.plain(200, `{}`)
	global := f.plain(429, `{"message":"You are being rate limited.","retry_after":0.3,"global":true}`,
		"Retry-After", "1", "X-RateLimit-Global", "true", "X-RateLimit-Scope", "global")
	mock.RegisterRegexpResponder("GET", channelRE, func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("Authorization") == "Bot a" && once.CompareAndSwap(false, true) {
			return global(r)
		}
		return ok(r)
	})
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("msg", 5, time.Second, false))
	c, _ := newClient(t, mock)
	start := time.Now()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a")) }()
	time.Sleep(50 * time.Millisecond)
	okResp(t)(do(t, c, "POST", api+"/channels/9/messages", "Bot b")) // another credential
	okResp(t)(do(t, c, "POST", api+"/channels/9/messages", "Bot a")) // another bucket, same credential
	wg.Wait()
	sent, n429, _ := f.stats()
	if n429 != 1 {
		t.Errorf("got %d 429s; want the one global 429", n429)
	}
	for _, s := range sent[1:] {
		paused := s.at.Sub(start) < 300*time.Millisecond
		if s.auth == "Bot a" && paused {
			t.Errorf("%s sent %v after the global 429; want every request of the credential paused 300ms", s.route, s.at.Sub(start))
		}
		if s.auth == "Bot b" && !paused {
			t.Errorf("other credential waited %v; want it unaffected", s.at.Sub(start))
		}
	}
}

func TestUser429BlocksTheBucket(t *testing.T) {
	t.Parallel()
	// A hidden limit: the headers say plenty remain, the 429 says wait.
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	ok := f.plain(200, `{}`, "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "0.1", "X-RateLimit-Bucket", "p")
	limited := f.plain(429, `{"message":"You are being rate limited.","retry_after":0.25,"global":false}`,
		"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "0.1", "X-RateLimit-Bucket", "p",
		"Retry-After", "1", "X-RateLimit-Scope", "user")
	mock.RegisterRegexpResponder("PATCH", channelRE, func(r *http.Request) (*http.Response, error) {
		if calls.Add(1) == 2 {
			return limited(r)
		}
		return ok(r)
	})
	var events []ratecord.Event
	var mu sync.Mutex
	c, _ := newClient(t, mock, ratecord.WithEventHandler(func(e ratecord.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }))
	okResp(t)(do(t, c, "PATCH", api+"/channels/1", "Bot a"))
	okResp(t)(do(t, c, "PATCH", api+"/channels/1", "Bot a")) // 429, then retried
	okResp(t)(do(t, c, "PATCH", api+"/channels/1", "Bot a"))
	sent, _, _ := f.stats()
	if len(sent) != 4 {
		t.Fatalf("server saw %d requests; want 4", len(sent))
	}
	if d := sent[2].at.Sub(sent[1].at); d < 250*time.Millisecond {
		t.Errorf("retry after %v; want at least the 250ms retry_after", d)
	}
	if d := sent[3].at.Sub(sent[1].at); d < 250*time.Millisecond {
		t.Errorf("next request after %v; want the bucket blocked for 250ms", d)
	}
	mu.Lock()
	defer mu.Unlock()
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind.String()+":"+string(e.Scope))
	}
	if got := strings.Join(kinds, ","); got != "rate_limited:user,retrying:user" {
		t.Errorf("events = %s; want rate_limited:user,retrying:user", got)
	}
}

func TestShared429DelaysWithoutTouchingTheCounter(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	ok := f.plain(200, `{}`, "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "5", "X-RateLimit-Bucket", "m")
	shared := f.plain(429, `{"message":"busy","retry_after":0.2,"global":false}`,
		"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "5", "X-RateLimit-Bucket", "m",
		"Retry-After", "1", "X-RateLimit-Scope", "shared")
	mock.RegisterRegexpResponder("POST", messagesRE, func(r *http.Request) (*http.Response, error) {
		if calls.Add(1) == 2 {
			return shared(r)
		}
		return ok(r)
	})
	c, _ := newClient(t, mock, ratecord.WithInvalidRequestBudget(1))
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	// The counter was not reset to zero by the shared 429 (its window is
	// 5 s), and a shared 429 is not an invalid request for the guard.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	mustOK(t, resp, err)
	sent, _, _ := f.stats()
	if d := sent[2].at.Sub(sent[1].at); d < 200*time.Millisecond {
		t.Errorf("retry after %v; want the 200ms retry_after", d)
	}
}

// TestCloudflareBlockBacksOffExponentially: probes into a block that
// lasts go when it has lasted one, two, four... pauses, up to the cap.
func TestCloudflareBlockBacksOffExponentially(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	block := f.plain(429, `<html><body>error code: 1015</body></html>`, "Content-Type", "text/html")
	ok := f.plain(200, `{}`)
	mock.RegisterRegexpResponder("GET", channelRE, func(r *http.Request) (*http.Response, error) {
		if calls.Add(1) <= 3 {
			return block(r)
		}
		return ok(r)
	})
	c, _ := newClient(t, mock, ratecord.WithBlockPause(time.Second, 2*time.Second), ratecord.WithResetOffset(0))
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a"))
	sent, _, _ := f.stats()
	if len(sent) != 4 {
		t.Fatalf("server saw %d requests; want 4", len(sent))
	}
	for i, want := range []time.Duration{time.Second, time.Second, 2 * time.Second} {
		if d := sent[i+1].at.Sub(sent[i].at); d < want {
			t.Errorf("attempt %d came %v after the one before; want at least %v (a pause, again, then doubling, capped)", i+2, d, want)
		}
	}
}

// TestCloudflareBlockHoldsTheRouteForEveryCredential: a bare header-less
// 429 holds its route for every credential of the transport, one probe at
// a time, while other routes go on.
func TestCloudflareBlockHoldsTheRouteForEveryCredential(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	block := f.plain(429, ``)
	ok := f.plain(200, `{}`)
	mock.RegisterRegexpResponder("GET", channelRE, func(r *http.Request) (*http.Response, error) {
		if calls.Add(1) == 1 {
			return block(r)
		}
		return ok(r)
	})
	mock.RegisterRegexpResponder("GET", messagesRE, ok)
	c, _ := newClient(t, mock, ratecord.WithBlockPause(time.Second, time.Second))
	start := time.Now()
	first := make(chan error, 1)
	go func() {
		resp, err := do(t, c, "GET", api+"/channels/1", "Bot a")
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	// Another route goes at once.
	okResp(t)(do(t, c, "GET", api+"/channels/2/messages", "Bot b"))
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("another route took %v during the block; want it unaffected", d)
	}
	// The blocked route waits, for another credential too.
	resp, err := do(t, c, "GET", api+"/channels/2", "Bot b")
	mustOK(t, resp, err)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	sent, _, _ := f.stats()
	var onRoute []time.Time
	for _, s := range sent {
		if channelRE.MatchString(s.route) {
			onRoute = append(onRoute, s.at)
		}
	}
	if len(onRoute) != 3 {
		t.Fatalf("server saw %d requests on the route; want 3 (the block, the probe, the other)", len(onRoute))
	}
	if d := onRoute[1].Sub(onRoute[0]); d < time.Second {
		t.Errorf("the next request on the route came %v after the block; want at least 1s", d)
	}
}

func TestRetriesAreBounded(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	body := `{"message":"You are being rate limited.","retry_after":0.01,"global":false}`
	mock.RegisterRegexpResponder("POST", messagesRE, f.plain(429, body, "X-RateLimit-Scope", "user", "Retry-After", "1"))
	var gaveUp atomic.Int32
	c, _ := newClient(t, mock, ratecord.WithRetries(2), ratecord.WithEventHandler(func(e ratecord.Event) {
		if e.Kind == ratecord.EventGaveUp {
			gaveUp.Add(1)
		}
	}))
	req, _ := http.NewRequest("POST", api+"/channels/1/messages", strings.NewReader(`{"content":"hi"}`))
	req.Header.Set("Authorization", "Bot a")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || string(got) != body {
		t.Errorf("got %d %q; want the last 429 with its body intact", resp.StatusCode, got)
	}
	if n := mock.GetTotalCallCount(); n != 3 {
		t.Errorf("sent %d times; want 3 (1 + 2 retries)", n)
	}
	if gaveUp.Load() != 1 {
		t.Errorf("gave-up events = %d; want 1", gaveUp.Load())
	}
}

// onceReader is a body that cannot be replayed.
type onceReader struct{ io.Reader }

func (onceReader) Close() error { return nil }

func TestUnreplayableBodyReturnsThe429(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	body := `{"message":"You are being rate limited.","retry_after":0.01,"global":false}`
	mock.RegisterRegexpResponder("POST", messagesRE, f.plain(429, body, "X-RateLimit-Scope", "user"))
	c, _ := newClient(t, mock)
	req, _ := http.NewRequest("POST", api+"/channels/1/messages", onceReader{strings.NewReader("x")})
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || string(got) != body || mock.GetTotalCallCount() != 1 {
		t.Errorf("got %d %q after %d calls; want the 429 intact after one call", resp.StatusCode, got, mock.GetTotalCallCount())
	}
}

func TestServerErrorsRetryOnlyIdempotentMethods(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	handler := func(r *http.Request) (*http.Response, error) {
		if calls.Add(1)%2 == 1 {
			return httpmock.NewStringResponse(503, "unavailable"), nil
		}
		return httpmock.NewStringResponse(200, "{}"), nil
	}
	mock.RegisterRegexpResponder("GET", channelRE, handler)
	mock.RegisterRegexpResponder("POST", messagesRE, handler)
	fast := func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }
	c, _ := newClient(t, mock, ratecord.WithBackOff(fast))
	resp, err := do(t, c, "GET", api+"/channels/1", "Bot a")
	mustOK(t, resp, err)
	if n := calls.Load(); n != 2 {
		t.Errorf("GET: %d calls; want 2", n)
	}
	calls.Store(0)
	resp, err = do(t, c, "POST", api+"/channels/1/messages", "Bot a")
	if err != nil || resp.StatusCode != 503 || calls.Load() != 1 {
		t.Errorf("POST: %v, %d calls; want the 503 after one call", err, calls.Load())
	}
	// Network errors too.
	var netCalls atomic.Int32
	mock.RegisterRegexpResponder("GET", regexp.MustCompile(`/guilds/\d+$`), func(*http.Request) (*http.Response, error) {
		if netCalls.Add(1) == 1 {
			return nil, errors.New("connection reset")
		}
		return httpmock.NewStringResponse(200, "{}"), nil
	})
	resp, err = do(t, c, "GET", api+"/guilds/1", "Bot a")
	mustOK(t, resp, err)
}

// trackingBody records whether it was closed.
type trackingBody struct {
	io.Reader
	closed *atomic.Int32
}

func (b trackingBody) Close() error { b.closed.Add(1); return nil }

func TestRequestIsNotMutatedAndBodiesAreClosed(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	var closed, calls atomic.Int32
	var bodies []string
	var mu sync.Mutex
	mock.RegisterRegexpResponder("PUT", pinsRE, func(r *http.Request) (*http.Response, error) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		mu.Unlock()
		resp := httpmock.NewStringResponse(200, "{}")
		if calls.Add(1) == 1 {
			resp = httpmock.NewStringResponse(429, `{"retry_after":0.01}`)
			resp.Header.Set("X-RateLimit-Scope", "user")
		}
		resp.Body = trackingBody{resp.Body, &closed}
		return resp, nil
	})
	c, _ := newClient(t, mock)
	req, _ := http.NewRequest("PUT", api+"/channels/1/pins/2?reason=x", strings.NewReader("payload"))
	req.Header.Set("Authorization", "Bot a")
	before := req.Header.Clone()
	url := req.URL.String()
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if req.URL.String() != url || fmt.Sprint(req.Header) != fmt.Sprint(before) {
		t.Errorf("request changed: %s %v; was %s %v", req.URL, req.Header, url, before)
	}
	if got := strings.Join(bodies, ","); got != "payload,payload" {
		t.Errorf("bodies sent = %q; want the payload twice", got)
	}
	if closed.Load() != 2 {
		t.Errorf("%d response bodies closed; want 2 (the 429 by ratecord, the last by the caller)", closed.Load())
	}
}

func exhausted(hash string, resetAfter string) httpmock.Responder {
	return func(*http.Request) (*http.Response, error) {
		resp := httpmock.NewStringResponse(200, "{}")
		resp.Header.Set("X-RateLimit-Limit", "1")
		resp.Header.Set("X-RateLimit-Remaining", "0")
		resp.Header.Set("X-RateLimit-Reset-After", resetAfter)
		resp.Header.Set("X-RateLimit-Bucket", hash)
		return resp, nil
	}
}

func TestWaitsPastTheLimitFailFast(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, exhausted("m", "30"))
	c, _ := newClient(t, mock, ratecord.WithMaxWait(5*time.Second))
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))

	start := time.Now()
	_, err := do(t, c, "POST", api+"/channels/1/messages", "Bot a")
	var rl *ratecord.RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, ratecord.ErrWaitTooLong) {
		t.Fatalf("err = %v; want a *RateLimitError wrapping ErrWaitTooLong", err)
	}
	if rl.Route != "POST /channels/:id/messages" || rl.Bucket != "m" || rl.Scope != ratecord.ScopeUser || rl.RetryAfter < 29*time.Second {
		t.Errorf("error = %+v; want route, bucket m, scope user, retry-after about 30s", rl)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, err = doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	if !errors.As(err, &rl) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v; want a *RateLimitError wrapping context.DeadlineExceeded", err)
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("took %v; want both to fail at once, not wait", time.Since(start))
	}
	if n := mock.GetTotalCallCount(); n != 1 {
		t.Errorf("%d calls; want only the first", n)
	}
}

func TestCancelledWaiterLeavesTheQueue(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, exhausted("m", "0.3"))
	c, _ := newClient(t, mock)
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
	// The slot the cancelled waiter would have had goes to the next one.
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	if n := mock.GetTotalCallCount(); n != 2 {
		t.Errorf("%d calls; want 2", n)
	}
}

func TestInvalidRequestGuard(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, httpmock.NewStringResponder(403, `{"message":"Missing Access","code":50001}`))
	var tripped atomic.Int32
	c, _ := newClient(t, mock, ratecord.WithInvalidRequestBudget(3), ratecord.WithEventHandler(func(e ratecord.Event) {
		if e.Kind == ratecord.EventGuardTripped {
			tripped.Add(1)
		}
	}))
	for i := 0; i < 3; i++ {
		resp, err := do(t, c, "GET", api+"/channels/1", "Bot a")
		if err != nil || resp.StatusCode != 403 {
			t.Fatalf("request %d: %v; want the 403", i, err)
		}
	}
	_, err := do(t, c, "GET", api+"/channels/1", "Bot a")
	var rl *ratecord.RateLimitError
	if !errors.Is(err, ratecord.ErrInvalidBudget) || !errors.As(err, &rl) || rl.Scope != ratecord.ScopeGuard {
		t.Fatalf("err = %v; want the guard's refusal", err)
	}
	if n := mock.GetTotalCallCount(); n != 3 || tripped.Load() != 1 {
		t.Errorf("%d calls, %d guard events; want 3 and 1", n, tripped.Load())
	}
}

func TestUnauthorizedCredentialFailsFast(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterResponder("GET", api+"/users/@me", func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("Authorization") == "Bot bad" {
			return httpmock.NewStringResponse(401, `{"message":"401: Unauthorized","code":0}`), nil
		}
		return httpmock.NewStringResponse(200, `{}`), nil
	})
	webhook := regexp.MustCompile(`/webhooks/\d+/\w+$`)
	mock.RegisterRegexpResponder("POST", webhook, httpmock.NewStringResponder(404, `{"message":"Unknown Webhook","code":10015}`))
	c, _ := newClient(t, mock)
	if resp, _ := do(t, c, "GET", api+"/users/@me", "Bot bad"); resp == nil || resp.StatusCode != 401 {
		t.Fatalf("want the first 401 to reach the caller")
	}
	if _, err := do(t, c, "GET", api+"/users/@me", "Bot bad"); !errors.Is(err, ratecord.ErrUnauthorized) {
		t.Errorf("err = %v; want ErrUnauthorized", err)
	}
	okResp(t)(do(t, c, "GET", api+"/users/@me", "Bot good"))
	if resp, _ := do(t, c, "POST", api+"/webhooks/5/tok", ""); resp == nil || resp.StatusCode != 404 {
		t.Fatalf("want the first 404 to reach the caller")
	}
	if _, err := do(t, c, "POST", api+"/webhooks/5/tok", ""); !errors.Is(err, ratecord.ErrWebhookGone) {
		t.Errorf("err = %v; want ErrWebhookGone", err)
	}
	if n := mock.GetTotalCallCount(); n != 3 {
		t.Errorf("%d calls; want 3", n)
	}
}

func TestCloseReleasesWaiters(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, exhausted("m", "30"))
	tr := ratecord.NewTransport(mock, ratecord.WithMaxWait(0))
	c := &http.Client{Transport: tr}
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	errc := make(chan error, 5)
	for i := 0; i < 5; i++ {
		go func() { _, err := do(t, c, "POST", api+"/channels/1/messages", "Bot a"); errc <- err }()
	}
	time.Sleep(50 * time.Millisecond)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		if err := <-errc; !errors.Is(err, ratecord.ErrClosed) {
			t.Errorf("waiter %d: %v; want ErrClosed", i, err)
		}
	}
	if err := tr.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := do(t, c, "GET", api+"/users/@me", "Bot a"); !errors.Is(err, ratecord.ErrClosed) {
		t.Errorf("after Close: %v; want ErrClosed", err)
	}
}

func TestMalformedHeadersNeverUnblockEarly(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	mock.RegisterRegexpResponder("POST", messagesRE, func(*http.Request) (*http.Response, error) {
		resp := httpmock.NewStringResponse(200, "{}")
		resp.Header.Set("X-RateLimit-Bucket", "m")
		resp.Header.Set("X-RateLimit-Limit", "5")
		resp.Header.Set("X-RateLimit-Reset-After", "0.3")
		switch calls.Add(1) {
		case 1:
			resp.Header.Set("X-RateLimit-Remaining", "garbage") // read as 0
		default:
			resp.Header.Set("X-RateLimit-Remaining", "NaN")
		}
		return resp, nil
	})
	c, _ := newClient(t, mock)
	start := time.Now()
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	if d := time.Since(start); d < 300*time.Millisecond {
		t.Errorf("second request after %v; a malformed Remaining must count as none left until the 300ms reset", d)
	}
}

func TestManyGoroutines(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("msg", 5, 100*time.Millisecond, true))
	mock.RegisterRegexpResponder("PUT", pinsRE, f.bucket("pin", 3, 100*time.Millisecond, false))
	c, _ := newClient(t, mock, ratecord.WithGlobalLimit(100, time.Second))
	parallel(100, func(i int) {
		ch := i % 5
		if i%2 == 0 {
			okResp(t)(do(t, c, "POST", fmt.Sprintf("%s/channels/%d/messages", api, ch), fmt.Sprintf("Bot %d", i%2)))
		} else {
			okResp(t)(do(t, c, "PUT", fmt.Sprintf("%s/channels/%d/pins/1", api, ch), fmt.Sprintf("Bot %d", i%3)))
		}
	})
	if _, n429, _ := f.stats(); n429 != 0 {
		t.Errorf("got %d 429s; want none", n429)
	}
}

func TestNoSecretsInLogsOrEvents(t *testing.T) {
	t.Parallel()
	const (
		bot         = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.secretsecretsecretsecretsecretsecret12"
		hook        = "hA6cXzTUsyIEPl2rsoVnrm5bUgXvYbMzumVqpIsTGwQtb0ZD1Ow5IS8Q2-UEUyR8Y0Tp"
		interaction = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDEyMzQ1Njc4OTpzZWNyZXRzZWNyZXRzZWNyZXQ"
	)
	mock := httpmock.NewMockTransport()
	mock.RegisterNoResponder(httpmock.NewStringResponder(429, `{"retry_after":0.01}`).HeaderSet(http.Header{"X-Ratelimit-Scope": {"user"}}))
	var buf bytes.Buffer
	var mu sync.Mutex
	var events []string
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	c, _ := newClient(t, mock, ratecord.WithLogger(logger), ratecord.WithRetries(1), ratecord.WithEventHandler(func(e ratecord.Event) {
		mu.Lock()
		events = append(events, fmt.Sprintf("%+v", e))
		mu.Unlock()
	}))
	for _, u := range []string{"/users/@me", "/webhooks/1/" + hook, "/webhooks/2/" + interaction + "/messages/@original", "/interactions/3/" + interaction + "/callback"} {
		do(t, c, "POST", api+u, "Bot "+bot)
	}
	mu.Lock()
	defer mu.Unlock()
	all := buf.String() + strings.Join(events, "\n")
	if len(events) == 0 || buf.Len() == 0 {
		t.Fatal("nothing was logged or reported; the test would prove nothing")
	}
	for _, secret := range []string{bot, hook, interaction} {
		for i := 0; i+9 <= len(secret); i++ {
			if strings.Contains(all, secret[i:i+9]) {
				t.Fatalf("a piece of a token (%q) appears in logs or events:\n%s", secret[i:i+9], all)
			}
		}
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestRouteMovesToAnotherBucket(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	f.delay = 20 * time.Millisecond // requests overlap
	mock := httpmock.NewMockTransport()
	wide := f.bucket("wide", 50, 200*time.Millisecond, false)
	narrow := f.bucket("narrow", 3, 200*time.Millisecond, false)
	var moved atomic.Bool
	mock.RegisterRegexpResponder("POST", messagesRE, func(r *http.Request) (*http.Response, error) {
		if moved.Load() {
			return narrow(r)
		}
		return wide(r)
	})
	c, _ := newClient(t, mock)
	parallel(10, func(int) { okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a")) })
	moved.Store(true)
	parallel(30, func(int) { okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a")) })

	// Requests already sent when the route moved may meet the narrow
	// bucket's 429 (nothing announced the move); every request sent after
	// the first response that named the new bucket must not.
	sent, _, _ := f.stats()
	if len(sent) < 11 {
		t.Fatalf("server saw %d requests; want more than the first phase's 10", len(sent))
	}
	learned := sent[10].at // the first answer from the new bucket
	for _, s := range sent[10:] {
		if s.status == 429 && s.at.After(learned.Add(f.delay+10*time.Millisecond)) {
			t.Errorf("a request sent %v after the new bucket was announced got a 429", s.at.Sub(learned)-f.delay)
		}
	}
}

func TestBotGlobalLimit(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, f.plain(200, `{}`))
	const big, small = "123456789012345678", "876543210987654321"
	token := func(id string) string {
		return "Bot " + base64.RawStdEncoding.EncodeToString([]byte(id)) + ".GhIjKl.signature-part-of-the-token"
	}
	c, _ := newClient(t, mock, ratecord.WithGlobalLimit(2, time.Hour), ratecord.WithBotGlobalLimit(big, 4),
		ratecord.WithMaxWait(time.Minute))
	for i := range 4 {
		okResp(t)(do(t, c, "GET", fmt.Sprintf("%s/channels/%d", api, i), token(big)))
	}
	for i := range 2 {
		okResp(t)(do(t, c, "GET", fmt.Sprintf("%s/channels/%d", api, i), token(small)))
	}
	// Both bots have now spent their own limits: a fifth request of the
	// large bot and a third of the other wait for the hour-long window.
	for _, tok := range []string{token(big), token(small)} {
		_, err := do(t, c, "GET", api+"/channels/9", tok)
		var rl *ratecord.RateLimitError
		if !errors.As(err, &rl) || !errors.Is(err, ratecord.ErrWaitTooLong) || rl.Scope != store.ScopeGlobal {
			t.Errorf("request past the bot's global limit: %v; want a global *RateLimitError wrapping ErrWaitTooLong", err)
		}
	}
}

func TestPolicyOptionsWithStorePanic(t *testing.T) {
	t.Parallel()
	s := memstore.New()
	t.Cleanup(func() { s.Close() })
	defer func() {
		msg, _ := recover().(string)
		if !strings.Contains(msg, "WithInvalidRequestBudget") || !strings.Contains(msg, "WithPolicy") {
			t.Errorf("NewTransport(WithStore, WithInvalidRequestBudget) panicked with %q; want a message naming the option and WithPolicy", msg)
		}
	}()
	ratecord.NewTransport(nil, ratecord.WithStore(s), ratecord.WithInvalidRequestBudget(10))
	t.Error("NewTransport(WithStore, WithInvalidRequestBudget) returned; want a panic")
}

// TestRetryWaitEndsLikeAClaimWait checks that a wait before a retry that
// the context ends is reported as a wait for a slot is: a *RateLimitError
// wrapping the context's error; and that a back-off that stops returns the
// last response.
func TestRetryWaitEndsLikeAClaimWait(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, httpmock.NewStringResponder(503, "unavailable"))
	mock.RegisterRegexpResponder("GET", regexp.MustCompile(`/guilds/\d+$`), httpmock.NewErrorResponder(errors.New("connection reset")))
	slow := func() backoff.BackOff { return backoff.NewConstantBackOff(time.Hour) }
	c, _ := newClient(t, mock, ratecord.WithBackOff(slow))
	for _, url := range []string{api + "/channels/1", api + "/guilds/1"} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		_, err := doCtx(ctx, c, "GET", url, "Bot a", nil)
		cancel()
		var rl *ratecord.RateLimitError
		if !errors.As(err, &rl) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("GET %s with a deadline during the back-off: %v; want a *RateLimitError wrapping context.DeadlineExceeded", url, err)
		}
	}

	stop := func() backoff.BackOff { return &backoff.StopBackOff{} }
	c, _ = newClient(t, mock, ratecord.WithBackOff(stop))
	resp, err := do(t, c, "GET", api+"/channels/2", "Bot a")
	if err != nil || resp == nil || resp.StatusCode != 503 {
		t.Fatalf("GET with a back-off that stops: %v, %v; want the 503", resp, err)
	}
	resp.Body.Close()
}
