package ratecord_test

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
)

var reactionRE = regexp.MustCompile(`/channels/\d+/messages/\d+/reactions/`)

// hiddenSpacing answers like a bucket whose headers announce plenty (5 per
// 100 ms, 4 remaining) while Discord accepts one request per spacing: a
// request sooner than spacing after the last accepted one gets a user 429
// whose retry_after is the time left until the next slot.
func hiddenSpacing(f *fakeDiscord, spacing time.Duration) httpmock.Responder {
	var mu sync.Mutex
	var last time.Time
	ok := f.plain(200, `{}`, "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "0.100", "X-RateLimit-Bucket", "r")
	return func(r *http.Request) (*http.Response, error) {
		mu.Lock()
		now := time.Now()
		wait := spacing - now.Sub(last)
		if wait <= 0 {
			last = now
		}
		mu.Unlock()
		if wait <= 0 {
			return ok(r)
		}
		return f.plain(429, fmt.Sprintf(`{"message":"You are being rate limited.","retry_after":%.3f,"global":false}`, wait.Seconds()),
			"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "0.100", "X-RateLimit-Bucket", "r",
			"Retry-After", "1", "X-RateLimit-Scope", "user")(r)
	}
}

// TestContradicting429HoldsTheBucket: after a user 429 from a bucket whose
// headers said requests remained, the transport keeps to the spacing the
// 429 revealed, so the 429 is not repeated.
func TestContradicting429HoldsTheBucket(t *testing.T) {
	t.Parallel()
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("PATCH", channelRE, hiddenSpacing(f, 200*time.Millisecond))
	c, _ := newClient(t, mock)
	okResp(t)(do(t, c, "PATCH", api+"/channels/1", "Bot a")) // learns the bucket
	okResp(t)(do(t, c, "PATCH", api+"/channels/1", "Bot a")) // a 429, then its retry
	parallel(5, func(int) { okResp(t)(do(t, c, "PATCH", api+"/channels/1", "Bot a")) })
	if _, n429, _ := f.stats(); n429 != 1 {
		t.Errorf("got %d 429s; want only the first, which showed the real limit", n429)
	}
}

// TestReactionsAreSpaced: the reaction routes of a channel go one at a
// time, the reaction spacing apart, while their headers describe a long
// window (as the headers that overstated reactions did); with the spacing
// off, or headers describing a window of a second or less, which are
// taken at their word, they go together.
func TestReactionsAreSpaced(t *testing.T) {
	t.Parallel()
	const spacing = 100 * time.Millisecond
	for _, tc := range []struct {
		name        string
		spacing     time.Duration
		resetAfter  string // of the bucket's headers, in seconds
		limit, left string
		spaced      bool
	}{
		{"long window", spacing, "600", "200", "199", true},
		{"spacing off", 0, "600", "200", "199", false},
		{"window of a second", spacing, "1", "5", "4", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFakeDiscord()
			f.delay = 20 * time.Millisecond
			mock := httpmock.NewMockTransport()
			r := f.plain(200, `{}`, "X-RateLimit-Limit", tc.limit, "X-RateLimit-Remaining", tc.left, "X-RateLimit-Reset-After", tc.resetAfter, "X-RateLimit-Bucket", "r")
			mock.RegisterRegexpResponder("PUT", reactionRE, r)
			mock.RegisterRegexpResponder("DELETE", reactionRE, r)
			c, _ := newClient(t, mock, ratecord.WithReactionSpacing(tc.spacing))
			// Both routes learn their bucket (a route not known yet sends
			// one probe at a time of its own).
			okResp(t)(do(t, c, "PUT", api+"/channels/1/messages/2/reactions/%F0%9F%91%8D/@me", "Bot a"))
			okResp(t)(do(t, c, "DELETE", api+"/channels/1/messages/2/reactions/%F0%9F%91%8D/@me", "Bot a"))
			parallel(4, func(i int) {
				method := "PUT"
				if i%2 == 1 {
					method = "DELETE"
				}
				okResp(t)(do(t, c, method, api+fmt.Sprintf("/channels/1/messages/%d/reactions/%%F0%%9F%%91%%8D/@me", i+2), "Bot a"))
			})
			sent, _, maxIn := f.stats()
			if !tc.spaced {
				if maxIn < 2 {
					t.Errorf("max requests in flight = %d; want several", maxIn)
				}
				return
			}
			if maxIn != 1 {
				t.Errorf("max requests in flight = %d; want 1", maxIn)
			}
			for i := 2; i < len(sent); i++ {
				// Each goes spacing after the response to the one before,
				// which took the server's delay.
				if d := sent[i].at.Sub(sent[i-1].at); d < spacing {
					t.Errorf("reaction %d went %v after the one before; want at least %v", i, d, spacing)
				}
			}
		})
	}
}

// TestRetryKeepsItsPlace: a request retried after its 429 goes before the
// requests that queued behind it while it was in flight.
func TestRetryKeepsItsPlace(t *testing.T) {
	t.Parallel()
	var (
		mu      sync.Mutex
		order   []string
		arrived = make(chan struct{})
		release = make(chan struct{})
		once    sync.Once
	)
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", regexp.MustCompile(`/channels/\d+/messages`), func(r *http.Request) (*http.Response, error) {
		id := r.URL.Query().Get("id")
		mu.Lock()
		order = append(order, id)
		mu.Unlock()
		resp := httpmock.NewStringResponse(200, `{}`)
		if id == "a" {
			once.Do(func() {
				close(arrived)
				<-release
				resp = httpmock.NewStringResponse(429, `{"message":"You are being rate limited.","retry_after":0.3,"global":false}`)
				resp.Header.Set("X-RateLimit-Scope", "user")
			})
		}
		resp.Header.Set("X-RateLimit-Limit", "1")
		resp.Header.Set("X-RateLimit-Remaining", "0")
		resp.Header.Set("X-RateLimit-Reset-After", "0.050")
		resp.Header.Set("X-RateLimit-Bucket", "m")
		return resp, nil
	})
	c, _ := newClient(t, mock)
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages?id=first", "Bot a")) // learns the bucket
	var wg sync.WaitGroup
	send := func(id string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			okResp(t)(do(t, c, "POST", api+"/channels/1/messages?id="+id, "Bot a"))
		}()
	}
	send("a")
	<-arrived
	send("b")
	time.Sleep(20 * time.Millisecond)
	send("c")
	time.Sleep(20 * time.Millisecond)
	close(release)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if got, want := fmt.Sprint(order), "[first a a b c]"; got != want {
		t.Errorf("the server saw %s; want %s", got, want)
	}
}

// TestHiddenSublimitHoldsOnlyRenames: after a rename's 429 from the
// channel's hidden sublimit, renames of that channel wait out the
// sublimit (here they fail fast, the wait passing the maximum) while its
// other edits, and renames of other channels, go on.
func TestHiddenSublimitHoldsOnlyRenames(t *testing.T) {
	t.Parallel()
	discord := discordtest.NewServer(discordtest.WithHiddenSublimit(2, 10*time.Minute))
	t.Cleanup(discord.Close)
	c, _ := newClient(t, nil, ratecord.WithMaxWait(2*time.Second))
	url := func(channel string) string { return discord.URL() + "/api/v10/channels/" + channel }
	const ch1, ch2 = "111111111111111111", "222222222222222222"
	edit := func(channel, body string) (*http.Response, error) {
		return doCtx(t.Context(), c, "PATCH", url(channel), "Bot a", []byte(body))
	}
	okResp(t)(edit(ch1, `{"name":"one"}`))
	okResp(t)(edit(ch1, `{"topic":"two"}`))
	_, err := edit(ch1, `{"name":"three"}`) // the sublimit's 429, then a wait past the maximum
	var rl *ratecord.RateLimitError
	if !errors.As(err, &rl) {
		t.Fatalf("third rename: err = %v; want a *RateLimitError", err)
	}
	okResp(t)(edit(ch1, `{"nsfw":true}`)) // not a rename: goes on
	okResp(t)(edit(ch2, `{"name":"other"}`))
	before := discord.Stats().Requests
	if _, err := edit(ch1, `{"topic":"four"}`); !errors.As(err, &rl) {
		t.Errorf("fourth rename: err = %v; want a *RateLimitError", err)
	}
	if n := discord.Stats().Requests - before; n != 0 {
		t.Errorf("the fourth rename reached Discord (%d requests); want it refused before", n)
	}
	if got := discord.Stats().ByStatus[429]; got != 1 {
		t.Errorf("got %d 429s; want 1", got)
	}
}
