package discordtest

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// wantBare checks that a reply is a bare 429: Retry-After of one second,
// Via and Date, and no rate-limit header, Content-Type or body.
func (r *reply) wantBare(t *testing.T) {
	t.Helper()
	r.want(t, 429, append([]string{"Retry-After", "1", "Via", "1.1 google", "X-RateLimit-Scope", "", "X-RateLimit-Global", "",
		"Content-Type", ""}, noBucketHeaders()...)...)
	if r.header.Get("Date") == "" {
		t.Error("bare 429 without Date")
	}
	if len(r.body) != 0 {
		t.Errorf("bare 429 body = %q; want none", r.body)
	}
}

func TestBareLimit(t *testing.T) {
	t.Parallel()
	const callback = "POST /interactions/{interaction_id}/{interaction_token}/callback"
	h := newHarness(t, WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 5, Window: 5 * time.Second, Fixed: true}),
		WithBareLimit(BareLimit{Route: "POST /channels/{channel_id}/messages", Limit: 2, Window: time.Second}),
		WithBareLimit(BareLimit{Route: callback, Limit: 1, Window: 500 * time.Millisecond}))
	const path = "/api/v10/channels/1/messages"
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "4") // the bucket announces 5 per 5 s
	h.clock.Advance(200 * time.Millisecond)
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "3")
	h.do("POST", path, botA, `{}`).wantBare(t) // nothing told of it: unavoidable
	h.do("POST", path, botA, `{}`).wantBare(t) // within the reaction time: unavoidable
	h.clock.Advance(2 * time.Millisecond)
	h.do("POST", path, botA, `{}`).wantBare(t) // told, before the second passed: avoidable
	// Per credential and major parameter.
	h.do("POST", "/api/v10/channels/2/messages", botA, `{}`).want(t, 200)
	h.do("POST", path, botB, `{}`).want(t, 200)
	// The window opened at the first request; the waits named ran out at
	// 1.2 s and 1.202 s. Refused requests did not count on the bucket.
	h.clock.Advance(1100 * time.Millisecond)
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "2")
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "1")
	h.do("POST", path, botA, `{}`).wantBare(t) // after every wait named: unavoidable

	// An interaction callback, without a token, limited per client IP.
	const cb = "/api/v10/interactions/9/" + interactionTokenPrefix + "abc/callback"
	h.do("POST", cb, "", `{"type":4}`).want(t, 204)
	h.do("POST", cb, "", `{"type":4}`).wantBare(t) // 500 ms left, named as a second
	h.clock.Advance(600 * time.Millisecond)
	h.do("POST", cb, "", `{"type":4}`).want(t, 204) // a new window: the wait named is no limit in itself

	st := h.srv.Stats()
	if st.Bare != 5 || st.ByStatus[429] != 5 || st.Avoidable != 1 || st.Unavoidable != 4 || len(st.ByScope) != 0 || st.Invalid != 5 {
		t.Errorf("stats = %+v; want 5 bare 429s without scope, 1 avoidable, 4 unavoidable, 5 invalid", st)
	}
	var bare []LogEntry
	for _, e := range st.Log {
		if e.Bare {
			bare = append(bare, e)
		}
	}
	if len(bare) != 5 || bare[2].Avoidable != true || bare[0].RetryAfter != time.Second || bare[4].Route != callback ||
		!bare[0].Reached.Equal(bare[0].Time) {
		t.Errorf("bare log entries = %+v; want 5, the third avoidable, each naming 1 s, reached as decided", bare)
	}

	for _, l := range []BareLimit{{Limit: 1, Window: time.Second}, {Route: "GET /x", Window: time.Second}, {Route: "GET /x", Limit: 1}} {
		if _, err := Start(WithBareLimit(l)); err == nil {
			t.Errorf("Start(WithBareLimit(%+v)) succeeded; want an error", l)
		}
	}
}

func TestEdgeLimitEverywhereWithTextBody(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithEdgeLimit(EdgeLimit{Route: "GET /channels/{channel_id}/messages", Limit: 2, Window: time.Second,
		Block: 3 * time.Second, BanAfter: -1, Everywhere: true, Body: "Too Many Requests"}))
	const path = "/api/v10/channels/1/messages"
	wantText := func(r *reply) {
		t.Helper()
		r.want(t, 429, append([]string{"Content-Type", "text/plain; charset=utf-8", "Via", "", "Retry-After", "",
			"X-RateLimit-Scope", ""}, noBucketHeaders()...)...)
		if string(r.body) != "Too Many Requests" {
			t.Errorf("body = %q; want Too Many Requests", r.body)
		}
	}
	h.do("GET", path, botA, "").want(t, 200)
	h.do("POST", path, botA, `{}`).want(t, 200) // other routes do not count
	h.do("GET", path, botA, "").want(t, 200)
	wantText(h.do("GET", path, botA, "")) // sets off the block: unavoidable
	h.clock.Advance(2 * time.Millisecond)
	wantText(h.do("POST", path, botA, `{}`))              // another route, told: avoidable
	wantText(h.do("GET", "/api/v10/users/@me", botB, "")) // any route, any token: avoidable
	h.clock.Advance(time.Second)
	wantText(h.do("PATCH", "/api/v10/channels/2", botA, `{}`)) // a lone probe a second later: unavoidable
	wantText(h.do("POST", path, botA, `{}`))                   // at once after it: avoidable
	h.clock.Advance(2 * time.Second)
	h.do("POST", path, botA, `{}`).want(t, 200) // the block lasted 3 s
	st := h.srv.Stats()
	if st.EdgeBlocks != 5 || st.Avoidable != 3 || st.Unavoidable != 2 || st.Bans != 0 || st.Invalid != 0 {
		t.Errorf("stats = %+v; want 5 edge 429s, 3 avoidable, 2 unavoidable, nothing invalid, no ban", st)
	}
}

func TestEdgeLimitWithoutBlock(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithEdgeLimit(EdgeLimit{Route: "GET /channels/{channel_id}/messages", Limit: 2, Window: time.Second}))
	const path = "/api/v10/channels/1/messages"
	h.do("GET", path, botA, "").want(t, 200)
	h.do("GET", path, botA, "").want(t, 200)
	h.do("GET", path, botA, "").wantEdgeBlock(t) // over the rate: unavoidable
	h.do("POST", path, botA, `{}`).want(t, 200)  // not covered, nor blocked
	h.clock.Advance(2 * time.Millisecond)
	h.do("GET", path, botA, "").wantEdgeBlock(t) // told, within a second: avoidable
	h.clock.Advance(time.Second)
	// No block: the requests that fit pass at once.
	h.do("GET", path, botA, "").want(t, 200)
	h.do("GET", path, botA, "").want(t, 200)
	h.do("GET", path, botA, "").wantEdgeBlock(t) // a second after the refusal it knew: unavoidable
	st := h.srv.Stats()
	if st.EdgeBlocks != 3 || st.Avoidable != 1 || st.Unavoidable != 2 || st.Bans != 0 {
		t.Errorf("stats = %+v; want 3 edge 429s, 1 avoidable, 2 unavoidable, no ban", st)
	}
}

func TestSharedLimitPerMessage(t *testing.T) {
	t.Parallel()
	const route = "PUT /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me"
	h := newHarness(t, WithBuckets(Bucket{Hash: hashReaction, Limit: 5, Window: time.Second, Fixed: true}),
		WithSharedLimit(SharedLimit{Route: route, Resource: "channels/1/messages/{message_id}", Limit: 2, Window: time.Second}))
	react := func(channel, message string) string {
		return "/api/v10/channels/" + channel + "/messages/" + message + "/reactions/%F0%9F%91%8D/@me"
	}
	h.do("PUT", react("1", "10"), botA, "").want(t, 204, "X-RateLimit-Remaining", "4")
	h.do("PUT", react("1", "10"), botA, "").want(t, 204, "X-RateLimit-Remaining", "3")
	r := h.do("PUT", react("1", "10"), botA, "") // the message is busy; the bucket has room
	r.want(t, 429, "X-RateLimit-Scope", "shared", "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "3", "Retry-After", "1")
	if retry, global, _ := r.rateLimitBody(t); retry != 1 || global {
		t.Errorf("retry_after %v, global %v; want 1 and false", retry, global)
	}
	h.do("PUT", react("1", "20"), botB, "").want(t, 204) // another message has its own limit
	h.do("PUT", react("1", "20"), botA, "").want(t, 204, "X-RateLimit-Remaining", "2")
	h.do("PUT", react("1", "20"), botA, "").want(t, 429, "X-RateLimit-Scope", "shared") // shared by every credential
	h.do("PUT", react("2", "10"), botA, "").want(t, 204)                                // another channel is not covered
	h.clock.Advance(2 * time.Millisecond)
	h.do("PUT", react("1", "10"), botA, "").want(t, 429, "X-RateLimit-Scope", "shared") // told, and still unavoidable
	h.clock.Advance(time.Second)
	h.do("PUT", react("1", "10"), botA, "").want(t, 204)
	st := h.srv.Stats()
	if st.ByScope[ScopeShared] != 3 || st.Unavoidable != 3 || st.Avoidable != 0 || st.Invalid != 0 {
		t.Errorf("stats = %+v; want 3 shared 429s, unavoidable, not invalid", st)
	}
	if n := st.Successes[BucketKey{Hash: hashReaction, Major: "channels/1"}]; n != 5 {
		t.Errorf("%d reactions on channel 1; want 5", n)
	}
	for _, res := range []string{"channels/{x", "channels//1", "channels/{}"} {
		if _, err := Start(WithSharedLimit(SharedLimit{Resource: res, Limit: 1, Window: time.Second})); err == nil {
			t.Errorf("Start with shared resource %q succeeded; want an error", res)
		}
	}
}

func TestOverstatedLimit(t *testing.T) {
	t.Parallel()
	// The ban route: the headers say 5 per second, 1 passes.
	h := newHarness(t, WithBuckets(Bucket{Hash: "bans", Limit: 1, Window: time.Second, Fixed: true, Announced: 5}),
		WithRoutes(Route{Template: "PUT /guilds/{guild_id}/bans/{user_id}", Bucket: "bans"}))
	ban := func(user string) string { return "/api/v10/guilds/1/bans/" + user }
	h.do("PUT", ban("100"), botA, "").want(t, 204, "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "1.000")
	r := h.do("PUT", ban("101"), botA, "") // the headers said there was room: unavoidable
	r.want(t, 429, "X-RateLimit-Scope", "user", "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1.000")
	if retry, _, _ := r.rateLimitBody(t); retry != 1 {
		t.Errorf("retry_after = %v; want the real wait, 1", retry)
	}
	h.clock.Advance(2 * time.Millisecond)
	h.do("PUT", ban("101"), botA, "").want(t, 429) // before the retry_after it was told: avoidable
	h.clock.Advance(1100 * time.Millisecond)
	h.do("PUT", ban("101"), botA, "").want(t, 204, "X-RateLimit-Remaining", "4")
	h.do("PUT", ban("102"), botA, "").want(t, 429) // after every retry_after told ran out: unavoidable
	h.do("PUT", ban("102"), botB, "").want(t, 204) // per credential
	st := h.srv.Stats()
	if st.ByScope[ScopeUser] != 3 || st.Avoidable != 1 || st.Unavoidable != 2 {
		t.Errorf("stats = %+v; want 3 user 429s, 1 avoidable, 2 unavoidable", st)
	}
}

// latent sends requests to an emulator whose network's delays wait on a
// fake clock, moving the clock by step whenever a delay waits on it.
type latent struct {
	h    *harness
	step time.Duration
}

// start sends a request in the background; its error, if any, comes on
// the channel once it returns.
func (l latent) start(ctx context.Context, method, path, auth string) <-chan error {
	done := make(chan error, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, method, l.h.srv.URL()+path, strings.NewReader(`{}`))
		if err != nil {
			done <- err
			return
		}
		req.Header.Set("Authorization", auth)
		resp, err := l.h.client.Do(req)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		done <- err
	}()
	return done
}

// do sends a request and moves the clock through its way up and down.
func (l latent) do(method, path, auth string) {
	l.h.t.Helper()
	done := l.start(l.h.t.Context(), method, path, auth)
	for range 2 {
		waitUntil(l.h.t, "a delay waits", func() bool { return l.h.clock.Pending() == 1 })
		l.h.clock.Advance(l.step)
	}
	if err := <-done; err != nil {
		l.h.t.Fatalf("%s %s: %v", method, path, err)
	}
}

// TestLostResponseTellsNothing: a response whose client went away during
// the way down reached no one, so it makes no later 429 avoidable.
func TestLostResponseTellsNothing(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithLatency(20*time.Millisecond, 0), WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 1, Window: time.Minute}))
	l := latent{h: h, step: 10 * time.Millisecond}
	const path = "/api/v10/channels/1/messages"
	ctx, cancel := context.WithCancel(t.Context())
	done := l.start(ctx, "POST", path, botA)
	waitUntil(t, "the way up", func() bool { return h.clock.Pending() == 1 })
	h.clock.Advance(10 * time.Millisecond)
	waitUntil(t, "the way down", func() bool { return h.srv.Stats().Requests == 1 && h.clock.Pending() == 1 })
	cancel()
	waitUntil(t, "the response is lost", func() bool { return h.srv.Stats().Lost == 1 })
	if err := <-done; err == nil {
		t.Fatal("the canceled request returned no error")
	}
	h.clock.Advance(time.Second)
	l.do("POST", path, botA) // 429: the headers of the 200 never came
	h.clock.Advance(time.Millisecond)
	l.do("POST", path, botA) // 429 after the first 429's headers came: avoidable
	st := h.srv.Stats()
	if st.ByStatus[200] != 1 || st.ByStatus[429] != 2 || st.Unavoidable != 1 || st.Avoidable != 1 || st.Lost != 1 {
		t.Errorf("stats = %+v; want a lost 200, then an unavoidable and an avoidable 429", st)
	}
	if len(st.Log) != 3 || !st.Log[0].Lost || st.Log[1].Lost || !st.Log[1].Reached.Equal(st.Log[1].Time.Add(10*time.Millisecond)) {
		t.Errorf("log = %+v; want the first response marked lost, the others reached 10 ms after the decision", st.Log)
	}
}

// TestSentRequestsArrive: a request whose client gives up on its way up
// arrives with WithSentRequestsArrive, and not without it.
func TestSentRequestsArrive(t *testing.T) {
	t.Parallel()
	for _, arrive := range []bool{false, true} {
		opts := []Option{WithLatency(20*time.Millisecond, 0)}
		if arrive {
			opts = append(opts, WithSentRequestsArrive())
		}
		h := newHarness(t, opts...)
		ctx, cancel := context.WithCancel(t.Context())
		done := latent{h: h}.start(ctx, "POST", "/api/v10/channels/1/messages", botA)
		waitUntil(t, "the way up", func() bool { return h.clock.Pending() == 1 })
		cancel()
		if err := <-done; err == nil {
			t.Fatal("the canceled request returned no error")
		}
		if !arrive {
			waitUntil(t, "the request is dropped", func() bool { return h.clock.Pending() == 0 })
			if st := h.srv.Stats(); st.Requests != 0 {
				t.Errorf("without the option: %d requests arrived; want 0", st.Requests)
			}
			continue
		}
		h.clock.Advance(10 * time.Millisecond)
		waitUntil(t, "the response is lost", func() bool { return h.srv.Stats().Lost == 1 })
		if st := h.srv.Stats(); st.Requests != 1 || st.ByStatus[200] != 1 || len(st.Log) != 1 || !st.Log[0].Lost {
			t.Errorf("with the option: stats %+v; want one 200 that arrived, its response lost", st)
		}
	}
}

// TestFirstReachedKeepsLaterWhileEarlierInFlight: a later response is
// remembered while an earlier one to the same process is still on its way,
// since that one may yet be lost.
func TestFirstReachedKeepsLaterWhileEarlierInFlight(t *testing.T) {
	t.Parallel()
	s, err := newServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := startTime()
	p := process{ip: "127.0.0.1"}
	var f firstReached
	var a, b, c result
	f.add(&a, p, t0.Add(10*time.Millisecond))
	f.add(&b, p, t0.Add(20*time.Millisecond))
	if len(f) != 2 {
		t.Fatalf("%d records; want both, the first still on its way", len(f))
	}
	lost(a.told)
	written(b.told, t0.Add(21*time.Millisecond))
	q := &request{sent: t0.Add(22 * time.Millisecond), process: p}
	if !s.knewAny(f, q) {
		t.Error("the written response was forgotten with the lost one")
	}
	if q.sent = t0.Add(21500 * time.Microsecond); s.knewAny(f, q) {
		t.Error("a request sent within the reaction time of the written response knew it")
	}
	f.add(&c, p, t0.Add(30*time.Millisecond))
	if len(f) != 1 || len(c.told) != 0 {
		t.Errorf("%d records, %d told by a later response; want the written one alone", len(f), len(c.told))
	}
}
