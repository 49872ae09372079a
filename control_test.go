package ratecord_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/ratecord/ratecord"
)

func TestRequestMaxWait(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("m", 1, 5*time.Second, false))
	c, _ := newClient(t, mock, ratecord.WithMaxWait(time.Minute))
	okResp(t)(doCtx(context.Background(), c, "POST", api+"/channels/1/messages", "Bot a", nil))

	for _, tc := range []struct {
		name string
		ctx  context.Context
	}{
		{"never wait", ratecord.WithRequestMaxWait(context.Background(), 0)},
		{"100ms", ratecord.WithRequestMaxWait(context.Background(), 100*time.Millisecond)},
	} {
		t0 := time.Now()
		_, err := doCtx(tc.ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
		var rl *ratecord.RateLimitError
		if !errors.As(err, &rl) || !errors.Is(err, ratecord.ErrWaitTooLong) {
			t.Fatalf("%s: %v; want a *RateLimitError wrapping ErrWaitTooLong", tc.name, err)
		}
		if rl.RetryAfter < 4*time.Second || rl.RetryAfter > 6*time.Second {
			t.Errorf("%s: RetryAfter = %v; want the bucket's reset, about 5s", tc.name, rl.RetryAfter)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("%s: failed after %v; want at once", tc.name, d)
		}
	}
	if _, n429, _ := f.stats(); n429 != 0 {
		t.Errorf("%d 429s; want none", n429)
	}
}

func TestRequestMaxWaitBehindProbe(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, func(r *http.Request) (*http.Response, error) {
		<-release
		return httpmock.NewStringResponse(200, "{}"), nil
	})
	c, _ := newClient(t, mock)
	first := make(chan error, 1)
	go func() {
		resp, err := doCtx(context.Background(), c, "POST", api+"/channels/1/messages", "Bot a", nil)
		if err == nil {
			resp.Body.Close()
		}
		first <- err
	}()
	time.Sleep(50 * time.Millisecond) // the first request probes the unknown route
	_, err := doCtx(ratecord.WithRequestMaxWait(context.Background(), 0), c, "POST", api+"/channels/1/messages", "Bot a", nil)
	close(release)
	if !errors.Is(err, ratecord.ErrWaitTooLong) {
		t.Errorf("request that will not wait, behind a probe in flight: %v; want ErrWaitTooLong", err)
	}
	if err := <-first; err != nil {
		t.Errorf("probe: %v", err)
	}
}

func TestRequestRetries(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	tooMany := httpmock.NewStringResponder(429, `{"message":"You are being rate limited.","retry_after":0.01,"global":false}`).
		HeaderSet(http.Header{"X-Ratelimit-Scope": {"user"}})
	mock.RegisterRegexpResponder("GET", channelRE, tooMany)
	c, _ := newClient(t, mock, ratecord.WithRetries(0))
	resp, err := doCtx(ratecord.WithRequestRetries(context.Background(), 2), c, "GET", api+"/channels/1", "Bot a", nil)
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("%v, %v; want the last 429", resp, err)
	}
	resp.Body.Close()
	if n := mock.GetTotalCallCount(); n != 3 {
		t.Errorf("%d calls with two retries asked by the context; want 3", n)
	}

	c, _ = newClient(t, mock) // three retries by default
	mock.ZeroCallCounters()
	resp, err = doCtx(ratecord.WithRequestRetries(context.Background(), 0), c, "GET", api+"/channels/2", "Bot a", nil)
	if err != nil || resp.StatusCode != 429 {
		t.Fatalf("%v, %v; want the 429", resp, err)
	}
	resp.Body.Close()
	if n := mock.GetTotalCallCount(); n != 1 {
		t.Errorf("%d calls with no retry asked by the context; want 1", n)
	}
}

func TestReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&ratecord.RateLimitError{Route: "GET /users/@me", Err: ratecord.ErrWaitTooLong}, "wait_too_long"},
		{&ratecord.RateLimitError{Route: "GET /users/@me", Err: context.DeadlineExceeded}, "deadline_exceeded"},
		{ratecord.ErrInvalidBudget, "invalid_budget"},
		{errors.New("connection reset"), ""},
		{nil, ""},
	} {
		if got := ratecord.Reason(tc.err); got != tc.want {
			t.Errorf("Reason(%v) = %q; want %q", tc.err, got, tc.want)
		}
	}
}

// TestUnansweredRequestKeepsItsWindow: a request cancelled after it was
// sent may have opened a window at Discord that no response dated: when
// the window the last response dated ended before the request was given
// up, the bucket stays closed a whole window after it, not only until that
// reset. When the dated window lasted past it, the request counted there,
// and the bucket reopens at its reset.
func TestUnansweredRequestKeepsItsWindow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		resetAfter string
		wait       time.Duration // after the cancel, before the next request
		held       bool
	}{
		// The dated window (300 ms) ended before the cancel (500 ms): the
		// request may have opened a window of 300 ms from then.
		{"dated window ended", "0.3", 100 * time.Millisecond, true},
		// The dated window (1 s) lasted past the cancel: the request counted
		// in it, and it reopens at its reset.
		{"dated window lasted", "1", 600 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			mock := httpmock.NewMockTransport()
			mock.RegisterRegexpResponder("POST", messagesRE, func(r *http.Request) (*http.Response, error) {
				if calls.Add(1) == 2 {
					<-r.Context().Done() // never answered
					return nil, r.Context().Err()
				}
				resp := httpmock.NewStringResponse(200, "{}")
				resp.Header.Set("X-RateLimit-Bucket", "m")
				resp.Header.Set("X-RateLimit-Limit", "2")
				resp.Header.Set("X-RateLimit-Remaining", "1")
				resp.Header.Set("X-RateLimit-Reset-After", tc.resetAfter)
				return resp, nil
			})
			c, _ := newClient(t, mock)
			okResp(t)(doCtx(context.Background(), c, "POST", api+"/channels/1/messages", "Bot a", nil))
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			_, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
			cancel()
			if err == nil {
				t.Fatal("the unanswered request returned no error")
			}
			time.Sleep(tc.wait)
			_, err = doCtx(ratecord.WithRequestMaxWait(context.Background(), 0), c, "POST", api+"/channels/1/messages", "Bot a", nil)
			switch {
			case tc.held && !errors.Is(err, ratecord.ErrWaitTooLong):
				t.Errorf("request within a window of the unanswered one: %v; want it held (ErrWaitTooLong)", err)
			case !tc.held && err != nil:
				t.Errorf("request after the reset of the window the unanswered one counted in: %v; want it sent", err)
			}
		})
	}
}

func TestRequestPriority(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []string
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		order = append(order, r.Header.Get("X-Job"))
		mu.Unlock()
		resp := httpmock.NewStringResponse(200, "{}")
		resp.Header.Set("X-RateLimit-Bucket", "m")
		resp.Header.Set("X-RateLimit-Limit", "1")
		resp.Header.Set("X-RateLimit-Remaining", "0")
		resp.Header.Set("X-RateLimit-Reset-After", "0.1")
		return resp, nil
	})
	c, _ := newClient(t, mock)
	send := func(ctx context.Context, job string) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", api+"/channels/1/messages", nil)
		req.Header.Set("Authorization", "Bot a")
		req.Header.Set("X-Job", job)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	if err := send(context.Background(), "first"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, job := range []string{"bulk1", "bulk2", "reply"} {
		ctx := context.Background()
		if job == "reply" {
			ctx = ratecord.WithRequestPriority(ctx, ratecord.PriorityUrgent)
		}
		wg.Go(func() {
			if err := send(ctx, job); err != nil {
				t.Error(err)
			}
		})
		time.Sleep(20 * time.Millisecond) // arrival order
	}
	wg.Wait()
	if want := []string{"first", "reply", "bulk1", "bulk2"}; !slices.Equal(order, want) {
		t.Errorf("Discord saw %v; want %v", order, want)
	}
}
