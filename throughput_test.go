package ratecord_test

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
	"github.com/ratecord/ratecord/store/redisstore"
)

// bothStores are the stores every test of what a response teaches runs
// against: the memory store, and the Redis store on REDIS_ADDR (skipped
// without a server, failing with CI=true).
var bothStores = []struct {
	name string
	new  func(t *testing.T, p store.Policy) store.Store
}{
	{"memstore", func(t *testing.T, p store.Policy) store.Store {
		s := memstore.New(memstore.WithPolicy(p))
		t.Cleanup(func() { s.Close() })
		return s
	}},
	{"redisstore", func(t *testing.T, p store.Policy) store.Store {
		s, _ := newRedisSecretStore(t, redisstore.WithPolicy(p))
		return s
	}},
}

var interactionRE = regexp.MustCompile(`/interactions/\d+/[^/]+/callback$`)

// TestHeaderlessRetryAfterIsAWait: a 429 without rate-limit headers whose
// Retry-After names its wait (Discord's API sends such on some routes, with
// an empty body) is retried once that wait has passed, not after a block's
// back-off, and holds neither other credentials nor other routes.
func TestHeaderlessRetryAfterIsAWait(t *testing.T) {
	for _, st := range bothStores {
		t.Run(st.name, func(t *testing.T) {
			for _, tc := range []struct {
				name, path, auth string
				re               *regexp.Regexp
			}{
				{"bot route", "/channels/1/messages", "Bot a", messagesRE},
				{"interaction callback", "/interactions/7/aW50ZXJhY3Rpb24tdG9rZW4/callback", "", interactionRE},
			} {
				t.Run(tc.name, func(t *testing.T) {
					f := newFakeDiscord()
					mock := httpmock.NewMockTransport()
					var calls atomic.Int32
					limited := f.plain(429, ``, "Retry-After", "1", "Via", "1.1 google")
					ok := f.plain(200, `{}`, "Via", "1.1 google")
					mock.RegisterRegexpResponder("POST", tc.re, func(r *http.Request) (*http.Response, error) {
						if calls.Add(1) == 1 {
							return limited(r)
						}
						return ok(r)
					})
					mock.RegisterRegexpResponder("GET", channelRE, ok)
					c, _ := newClient(t, mock, ratecord.WithStore(st.new(t,
						store.Policy{ResetOffset: -1, BlockPause: 3 * time.Second, BlockPauseMax: 3 * time.Second})))
					done := make(chan error, 1)
					go func() {
						resp, err := doCtx(context.Background(), c, "POST", api+tc.path, tc.auth, []byte(`{}`))
						if err == nil && resp.StatusCode != 200 {
							t.Errorf("status %d; want 200 after the retry", resp.StatusCode)
						}
						done <- err
					}()
					for calls.Load() == 0 {
						time.Sleep(time.Millisecond)
					}
					// Another route goes at once.
					t0 := time.Now()
					okResp(t)(do(t, c, "GET", api+"/channels/2", "Bot a"))
					if d := time.Since(t0); d > 500*time.Millisecond {
						t.Errorf("another route waited %v; want it unaffected", d)
					}
					if err := <-done; err != nil {
						t.Fatal(err)
					}
					sent, _, _ := f.stats()
					var on []time.Time
					for _, s := range sent {
						if tc.re.MatchString(s.route) {
							on = append(on, s.at)
						}
					}
					if len(on) != 2 {
						t.Fatalf("server saw %d requests on the route; want 2", len(on))
					}
					// Exactly the named second: not sooner, and not the
					// 3 s a block of unknown length would pause.
					if d := on[1].Sub(on[0]); d < time.Second || d > 2*time.Second {
						t.Errorf("the retry went %v after the 429; want 1s (Retry-After), not a block's pause", d)
					}
				})
			}
		})
	}
}

// TestNonJSON429HoldsEveryRoute: a 429 whose body is not JSON, without
// rate-limit headers, comes from in front of Discord's API and covers the
// client's IP address: every route of every credential waits the block's
// pause, not only the route that met it.
func TestNonJSON429HoldsEveryRoute(t *testing.T) {
	for _, st := range bothStores {
		t.Run(st.name, func(t *testing.T) {
			f := newFakeDiscord()
			mock := httpmock.NewMockTransport()
			var calls atomic.Int32
			block := f.plain(429, `Too Many Requests`, "Content-Type", "text/plain; charset=utf-8")
			ok := f.plain(200, `{}`)
			mock.RegisterRegexpResponder("GET", channelRE, func(r *http.Request) (*http.Response, error) {
				if calls.Add(1) == 1 {
					return block(r)
				}
				return ok(r)
			})
			mock.RegisterRegexpResponder("GET", messagesRE, ok)
			c, _ := newClient(t, mock, ratecord.WithStore(st.new(t, store.Policy{BlockPause: time.Second, BlockPauseMax: time.Second})))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			resp, err := doCtx(ratecord.WithRequestRetries(ctx, 0), c, "GET", api+"/channels/1", "Bot a", nil)
			if err != nil || resp.StatusCode != 429 {
				t.Fatalf("first request: %v, %v; want the 429 back (no retries)", resp, err)
			}
			blockedAt := time.Now()
			for _, auth := range []string{"Bot a", "Bot b"} {
				okResp(t)(doCtx(ctx, c, "GET", api+"/channels/2/messages", auth, nil))
			}
			sent, _, _ := f.stats()
			if len(sent) != 3 {
				t.Fatalf("server saw %d requests; want 3", len(sent))
			}
			for _, s := range sent[1:] {
				if d := s.at.Sub(blockedAt); d < 900*time.Millisecond {
					t.Errorf("%s (%s) went %v after the IP-wide block; want the block's pause (1s)", s.route, s.auth, d)
				}
			}
		})
	}
}

// overstated answers like a bucket whose headers claim limit requests per
// window while Discord lets only real through: 200s count Remaining down
// from limit, the others get a 429 of scope user saying none is left.
func overstated(f *fakeDiscord, limit, real int, window time.Duration) httpmock.Responder {
	var mu sync.Mutex
	var start time.Time
	var n int
	return func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		now := time.Now()
		if start.IsZero() || now.Sub(start) >= window {
			start, n = now, 0
		}
		n++
		passed, left := n <= real, window-now.Sub(start)
		reset := float64(start.Add(window).UnixMilli()) / 1000
		mu.Unlock()
		h := []string{"X-RateLimit-Bucket", "bans", "X-RateLimit-Limit", strconv.Itoa(limit),
			"X-RateLimit-Reset", strconv.FormatFloat(reset, 'f', 3, 64),
			"X-RateLimit-Reset-After", strconv.FormatFloat(left.Seconds(), 'f', 3, 64)}
		if passed {
			return f.plain(200, `{}`, append(h, "X-RateLimit-Remaining", strconv.Itoa(limit-n))...)(r)
		}
		return f.plain(429, fmt.Sprintf(`{"message":"You are being rate limited.","retry_after":%.3f,"global":false}`, left.Seconds()),
			append(h, "X-RateLimit-Remaining", "0", "X-RateLimit-Scope", "user", "Retry-After", "1")...)(r)
	}
}

// TestOverstatedLimitIsLearned: a bucket whose headers say 5 per window
// while only 1 passes (a guild's bans) answers 429s to the requests the
// headers allowed; once one window showed it, the bucket is held to what
// passed, and the next windows bring no 429.
func TestOverstatedLimitIsLearned(t *testing.T) {
	banRE := regexp.MustCompile(`/guilds/\d+/bans/\d+$`)
	for _, st := range bothStores {
		t.Run(st.name, func(t *testing.T) {
			f := newFakeDiscord()
			mock := httpmock.NewMockTransport()
			mock.RegisterRegexpResponder("PUT", banRE, overstated(f, 5, 1, 250*time.Millisecond))
			c, _ := newClient(t, mock, ratecord.WithStore(st.new(t, store.Policy{ResetOffset: 5 * time.Millisecond})))
			// One request teaches the bucket (5, 4 remaining); then five at
			// once, as its headers allow.
			okResp(t)(do(t, c, "PUT", api+"/guilds/1/bans/1", "Bot a"))
			parallel(5, func(i int) {
				okResp(t)(do(t, c, "PUT", api+fmt.Sprintf("/guilds/1/bans/%d", 10+i), "Bot a"))
			})
			_, first, _ := f.stats()
			if first == 0 {
				t.Fatal("the emulated bucket answered no 429: the test does not test anything")
			}
			parallel(5, func(i int) {
				okResp(t)(do(t, c, "PUT", api+fmt.Sprintf("/guilds/1/bans/%d", 20+i), "Bot a"))
			})
			if _, n429, _ := f.stats(); n429 > first {
				t.Errorf("%d more 429s after the bucket showed its real limit (%d in the window that showed it); want none", n429-first, first)
			}
		})
	}
}

// TestShared429HoldsOnlyItsResource: a 429 of scope shared on one
// message's reactions holds that message's reactions for the wait it
// names; the reactions of another message of the same channel (the same
// bucket) go on at the bucket's rate.
func TestShared429HoldsOnlyItsResource(t *testing.T) {
	reactRE := regexp.MustCompile(`/channels/\d+/messages/\d+/reactions/[^/]+/@me$`)
	for _, st := range bothStores {
		t.Run(st.name, func(t *testing.T) {
			f := newFakeDiscord()
			mock := httpmock.NewMockTransport()
			var busy atomic.Bool
			busy.Store(true)
			headers := []string{"X-RateLimit-Limit", "50", "X-RateLimit-Remaining", "40", "X-RateLimit-Reset-After", "10", "X-RateLimit-Bucket", "react"}
			ok := f.plain(204, ``, headers...)
			shared := f.plain(429, `{"message":"busy","retry_after":0.8,"global":false}`,
				append(headers, "X-RateLimit-Scope", "shared", "Retry-After", "1")...)
			mock.RegisterRegexpResponder("PUT", reactRE, func(r *http.Request) (*http.Response, error) {
				if strings.Contains(r.URL.Path, "/messages/1/") && busy.CompareAndSwap(true, false) {
					return shared(r)
				}
				return ok(r)
			})
			// Without the reaction spacing, so that the bucket's rate shows.
			c, _ := newClient(t, mock, ratecord.WithStore(st.new(t, store.Policy{ResetOffset: -1})), ratecord.WithReactionSpacing(0))
			okResp2 := func(resp *http.Response, err error) {
				t.Helper()
				if err != nil || resp.StatusCode != 204 {
					t.Errorf("got %v, %v; want 204", resp, err)
				}
			}
			// Learn the bucket.
			okResp2(do(t, c, "PUT", api+"/channels/9/messages/2/reactions/%F0%9F%91%8D/@me", "Bot a"))
			done := make(chan struct{})
			go func() {
				defer close(done)
				okResp2(do(t, c, "PUT", api+"/channels/9/messages/1/reactions/%F0%9F%91%8D/@me", "Bot a"))
			}()
			for f.count(reactRE, 429) == 0 {
				time.Sleep(time.Millisecond)
			}
			t0 := time.Now()
			for range 5 {
				okResp2(do(t, c, "PUT", api+"/channels/9/messages/2/reactions/%F0%9F%91%8D/@me", "Bot a"))
			}
			if d := time.Since(t0); d > 400*time.Millisecond {
				t.Errorf("the other message's reactions took %v; want them unaffected by the shared 429", d)
			}
			// Its own resource waits: a caller that will not wait is told.
			_, err := doCtx(ratecord.WithRequestMaxWait(context.Background(), 0), c, "PUT",
				api+"/channels/9/messages/1/reactions/%F0%9F%91%8D/@me", "Bot a", nil)
			var rl *ratecord.RateLimitError
			if !errors.As(err, &rl) || rl.Scope != store.ScopeShared {
				t.Errorf("a request for the held resource that will not wait: %v; want a RateLimitError of scope shared", err)
			}
			<-done
			sent, _, _ := f.stats()
			var limitedAt, retryAt time.Time
			for _, s := range sent {
				if strings.Contains(s.route, "/messages/1/") {
					if s.status == 429 {
						limitedAt = s.at
					} else if retryAt.IsZero() {
						retryAt = s.at
					}
				}
			}
			if d := retryAt.Sub(limitedAt); d < 800*time.Millisecond || d > 1500*time.Millisecond {
				t.Errorf("the limited resource went again %v after its 429; want when its retry_after (800ms) ended", d)
			}
		})
	}
}

// TestDeadlineShorterThanTheRoundTripIsNotSent: a request whose deadline
// leaves less than the round trip the transport has measured is not sent
// (it would be cancelled on its way, after Discord counted it): it fails
// with context.DeadlineExceeded, and its slot goes to the next request.
func TestDeadlineShorterThanTheRoundTripIsNotSent(t *testing.T) {
	f := newFakeDiscord()
	f.delay = 100 * time.Millisecond
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("m", 1, time.Minute, false))
	mock.RegisterRegexpResponder("GET", channelRE, f.plain(200, `{}`))
	c, _ := newClient(t, mock)
	// A round trip of 100 ms, measured.
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a"))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	var rl *ratecord.RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request with 50ms left of a 100ms round trip: %v; want a RateLimitError matching context.DeadlineExceeded", err)
	}
	if sent, _, _ := f.stats(); len(sent) != 1 {
		t.Fatalf("server saw %d requests; want 1 (the short-deadline one not sent)", len(sent))
	}
	// Its slot, the bucket's only one, was given back.
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	mustOK(t, resp, err)
}

// TestDeadlineThatCannotOutliveTheWaitIsRefusedAtOnce: a request whose
// deadline comes after its bucket reopens, but too soon after it for a
// round trip, is refused when it claims, with the known wait, not when
// the slot opens (it would be given back then: in a bucket shared through
// Redis, every process's such waiter would claim at the reopening); the
// slot goes to the next request.
func TestDeadlineThatCannotOutliveTheWaitIsRefusedAtOnce(t *testing.T) {
	f := newFakeDiscord()
	f.delay = 300 * time.Millisecond
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("m", 1, time.Second, false))
	c, _ := newClient(t, mock)
	// A round trip of 300 ms, measured; the bucket reopens about 1 s
	// after the response.
	resp, err := doCtx(context.Background(), c, "POST", api+"/channels/1/messages", "Bot a", nil)
	mustOK(t, resp, err)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	_, err = doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	took := time.Since(start)
	var rl *ratecord.RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("request with 1.2 s left, its bucket reopening in about 1 s, a round trip of 300 ms: %v; want a RateLimitError matching context.DeadlineExceeded", err)
	}
	if rl.RetryAfter < 500*time.Millisecond || took > 700*time.Millisecond {
		t.Errorf("refused after %v with RetryAfter %v; want at once, with the known wait (about 1 s)", took, rl.RetryAfter)
	}
	if sent, _, _ := f.stats(); len(sent) != 1 {
		t.Fatalf("server saw %d requests; want 1 (the short-deadline one not sent)", len(sent))
	}
	resp, err = doCtx(context.Background(), c, "POST", api+"/channels/1/messages", "Bot a", nil)
	mustOK(t, resp, err)
	if sent, _, _ := f.stats(); len(sent) != 2 || sent[1].status != 200 {
		t.Fatalf("server saw %v; want a second request, answered 200", sent)
	}
}

// TestDeadlineShorterThanAnyRoundTripIsNotSent: before its first response
// a transport has measured no round trip, yet a request with a few
// milliseconds left cannot come back from Discord in time (a process of
// many sharing a bucket through Redis may get a slot before it ever heard
// from Discord): it is not sent, and its slot goes to the next request,
// which has time to use it.
func TestDeadlineShorterThanAnyRoundTripIsNotSent(t *testing.T) {
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("m", 1, time.Minute, false))
	c, _ := newClient(t, mock)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	_, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	var rl *ratecord.RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("first request with 5ms left: %v; want a RateLimitError matching context.DeadlineExceeded", err)
	}
	if sent, _, _ := f.stats(); len(sent) != 0 {
		t.Fatalf("server saw %d requests; want none", len(sent))
	}
	ctx, cancel = context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	resp, err := doCtx(ctx, c, "POST", api+"/channels/1/messages", "Bot a", nil)
	mustOK(t, resp, err)
}
