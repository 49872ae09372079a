package discordtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const botA, botB = "Bot token-a", "Bot token-b"

func TestFixedWindow(t *testing.T) {
	t.Parallel()
	h := newHarness(t,
		WithoutDefaultTable(),
		WithBuckets(Bucket{Hash: "fixed", Limit: 3, Window: 10 * time.Second, Fixed: true}),
		WithRoutes(Route{Template: "PATCH /guilds/{guild_id}/members/{user_id}", Bucket: "fixed"}))
	const path = "/api/v10/guilds/1/members/2"
	for i, resetAfter := range []string{"10.000", "9.000", "8.000"} {
		h.do("PATCH", path, botA, `{}`).want(t, 200,
			"X-RateLimit-Limit", "3", "X-RateLimit-Remaining", strconv.Itoa(2-i),
			"X-RateLimit-Reset-After", resetAfter, "X-RateLimit-Bucket", "fixed")
		h.clock.Advance(time.Second)
	}
	r := h.do("PATCH", path, botA, `{}`)
	r.want(t, 429, "X-RateLimit-Scope", "user", "X-RateLimit-Remaining", "0",
		"X-RateLimit-Reset-After", "7.000", "Retry-After", "7", "X-RateLimit-Global", "")
	if retry, global, _ := r.rateLimitBody(t); retry != 7 || global {
		t.Errorf("429 body retry_after, global = %v, %v; want 7, false", retry, global)
	}
	h.clock.Advance(6*time.Second + 999*time.Millisecond)
	h.do("PATCH", path, botA, `{}`).want(t, 429, "Retry-After", "1", "X-RateLimit-Reset-After", "0.001")
	// The window empties all at once.
	h.clock.Advance(time.Millisecond)
	h.do("PATCH", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "2", "X-RateLimit-Reset-After", "10.000")
}

func TestSlidingWindowRefillsOneSlotAtATime(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const path = "/api/v10/channels/1/messages"
	for i := range 5 {
		h.do("POST", path, botA, `{"content":"hi"}`).want(t, 200,
			"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", strconv.Itoa(4-i),
			"X-RateLimit-Reset-After", fmt.Sprintf("%d.000", i+1), "X-RateLimit-Bucket", hashMessageCreate)
	}
	r := h.do("POST", path, botA, `{"content":"hi"}`)
	r.want(t, 429, "X-RateLimit-Scope", "user", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "5.000", "Retry-After", "1")
	if retry, _, _ := r.rateLimitBody(t); retry != 1 {
		t.Errorf("retry_after = %v; want 1 (one slot)", retry)
	}
	h.clock.Advance(500 * time.Millisecond)
	h.do("POST", path, botA, `{}`).want(t, 429, "X-RateLimit-Reset-After", "4.500")
	h.clock.Advance(500 * time.Millisecond)
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "5.000")
	h.do("POST", path, botA, `{}`).want(t, 429)
	h.clock.Advance(2 * time.Second)
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "1", "X-RateLimit-Reset-After", "4.000")
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "0")
	h.do("POST", path, botA, `{}`).want(t, 429)
}

func TestSharedHashSharesCounterPerMajorParameter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	// PATCH member and PUT role share one fixed 10/10s bucket.
	for i := range 10 {
		method, path := "PATCH", "/api/v10/guilds/1/members/2"
		if i%2 == 1 {
			method, path = "PUT", "/api/v10/guilds/1/members/2/roles/3"
		}
		h.do(method, path, botA, `{}`).want(t, map[string]int{"PATCH": 200, "PUT": 204}[method],
			"X-RateLimit-Bucket", hashMemberModify, "X-RateLimit-Remaining", strconv.Itoa(9-i))
	}
	h.do("PUT", "/api/v10/guilds/1/members/9/roles/3", botA, "").want(t, 429, "X-RateLimit-Scope", "user")
	h.do("PATCH", "/api/v10/guilds/1/members/9", botA, `{}`).want(t, 429, "X-RateLimit-Scope", "user")
	// Another guild is another counter.
	h.do("PATCH", "/api/v10/guilds/2/members/2", botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "9")
}

func TestCounterPerCredential(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const path = "/api/v10/channels/1/messages"
	for range 5 {
		h.do("POST", path, botA, `{}`).want(t, 200)
	}
	h.do("POST", path, botA, `{}`).want(t, 429)
	h.do("POST", path, botB, `{}`).want(t, 200, "X-RateLimit-Remaining", "4")
	h.do("POST", path, "", `{}`).want(t, 200, "X-RateLimit-Remaining", "4")
}

func TestPathPrefixesShareACounter(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for i, path := range []string{"/api/v10/channels/1/messages", "/api/channels/1/messages", "/channels/1/messages?limit=5"} {
		h.do("GET", path, botA, "").want(t, 200, "X-RateLimit-Bucket", hashMessageList, "X-RateLimit-Remaining", strconv.Itoa(4-i))
	}
}

func TestGlobalLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithGlobalLimit(50))
	// GET /gateway is outside the bucket table: only the global limit applies.
	for range 50 {
		h.do("GET", "/api/v10/gateway", botA, "").want(t, 200, noBucketHeaders()...)
	}
	h.clock.Advance(400 * time.Millisecond)
	r := h.do("GET", "/api/v10/gateway", botA, "")
	want := append([]string{"X-RateLimit-Scope", "global", "X-RateLimit-Global", "true", "Retry-After", "1", "Via", "1.1 google"}, noBucketHeaders()...)
	r.want(t, 429, want...)
	if retry, global, raw := r.rateLimitBody(t); retry != 0.6 || !global || !strings.Contains(raw, `"retry_after":0.600`) {
		t.Errorf("global 429 body = %s; want retry_after 0.600 and global true", raw)
	}
	// A bucketed route is paused too, and the global 429 has no bucket headers.
	h.do("POST", "/api/v10/channels/1/messages", botA, `{}`).want(t, 429, append([]string{"X-RateLimit-Scope", "global"}, noBucketHeaders()...)...)

	// Interaction callbacks and interaction webhooks are exempt.
	for i := range 5 {
		h.do("POST", fmt.Sprintf("/api/v10/interactions/%d/tok/callback", i), botA, `{"type":4}`).want(t, 204)
	}
	h.do("POST", "/api/v10/webhooks/7/"+interactionTokenPrefix+"abc", botA, `{"content":"x"}`).want(t, 204)

	// Other credentials and unauthenticated requests have their own budget.
	h.do("GET", "/api/v10/gateway", botB, "").want(t, 200)
	h.do("GET", "/api/v10/gateway", "", "").want(t, 200)

	// The window slides: the first requests leave it one second after they came.
	h.clock.Advance(600 * time.Millisecond)
	h.do("GET", "/api/v10/gateway", botA, "").want(t, 200)

	if st := h.srv.Stats(); st.ByScope[ScopeGlobal] != 2 || st.Avoidable != 2 {
		t.Errorf("stats: global 429s %d, avoidable %d; want 2, 2", st.ByScope[ScopeGlobal], st.Avoidable)
	}
}

func TestGlobalLimitPerClientIP(t *testing.T) {
	t.Parallel()
	s, err := Start(withClock((&fakeClock{t: startTime()}).Now), WithGlobalLimit(3))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	for range 3 {
		if rec := serve(s, "GET", "/api/v10/gateway", "", "10.0.0.1:5000"); rec.Code != 200 {
			t.Fatalf("status = %d; want 200", rec.Code)
		}
	}
	if rec := serve(s, "GET", "/api/v10/gateway", "", "10.0.0.1:5001"); rec.Code != 429 || rec.Header().Get("X-RateLimit-Scope") != "global" {
		t.Fatalf("4th unauthenticated request from one IP: status %d scope %q; want 429 global", rec.Code, rec.Header().Get("X-RateLimit-Scope"))
	}
	if rec := serve(s, "GET", "/api/v10/gateway", "", "10.0.0.2:5000"); rec.Code != 200 {
		t.Fatalf("request from another IP: status %d; want 200", rec.Code)
	}
	if rec := serve(s, "GET", "/api/v10/gateway", botA, "10.0.0.1:5000"); rec.Code != 200 {
		t.Fatalf("authenticated request from the same IP: status %d; want 200", rec.Code)
	}
}

func TestHeaderFormats(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithGlobalLimit(0))
	h.clock.Advance(123456789 * time.Nanosecond)
	r := h.do("POST", "/api/v10/channels/1/messages", botA, `{"content":"x"}`)
	r.want(t, 200,
		"Date", "Tue, 14 Nov 2023 22:13:20 GMT",
		"Via", "1.1 google",
		"X-RateLimit-Reset", "1700000001.124",
		"X-RateLimit-Reset-After", "1.000")
	threeDecimals := regexp.MustCompile(`^\d+\.\d{3}$`)
	for _, name := range []string{"X-RateLimit-Reset", "X-RateLimit-Reset-After"} {
		if v := r.header.Get(name); !threeDecimals.MatchString(v) {
			t.Errorf("%s = %q; want seconds with three decimals", name, v)
		}
	}

	// The reaction bucket allows one per 0.25 s: a quarter-second
	// retry_after, and Retry-After rounded up to a whole second.
	const reaction = "/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me"
	h.do("PUT", reaction, botA, "").want(t, 204, "X-RateLimit-Limit", "1", "X-RateLimit-Reset-After", "0.250")
	r = h.do("PUT", reaction, botA, "")
	r.want(t, 429, "Retry-After", "1", "X-RateLimit-Reset-After", "0.250", "X-RateLimit-Scope", "user",
		"Content-Type", "application/json")
	if retry, global, raw := r.rateLimitBody(t); retry != 0.25 || global || !strings.Contains(raw, `"retry_after":0.250`) {
		t.Errorf("429 body = %s; want retry_after 0.250, global false", raw)
	}
	h.clock.Advance(100 * time.Millisecond)
	r = h.do("PUT", reaction, botA, "")
	if retry, _, _ := r.rateLimitBody(t); retry != 0.15 {
		t.Errorf("retry_after = %v; want 0.15", retry)
	}
}

func TestHiddenSublimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for range 2 {
		h.do("PATCH", "/api/v10/channels/1", botA, `{"name":"new-name"}`).want(t, 200)
	}
	r := h.do("PATCH", "/api/v10/channels/1", botA, `{"topic":"new topic"}`)
	// The bucket still has room: the sublimit is announced by no header.
	r.want(t, 429, "X-RateLimit-Scope", "user", "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "3")
	if retry, _, _ := r.rateLimitBody(t); retry != 600 {
		t.Errorf("retry_after = %v; want 600", retry)
	}
	// Other changes to the channel and other channels are not affected.
	h.do("PATCH", "/api/v10/channels/1", botA, `{"nsfw":true}`).want(t, 200, "X-RateLimit-Remaining", "2")
	h.do("PATCH", "/api/v10/channels/2", botA, `{"name":"x"}`).want(t, 200)
	h.clock.Advance(10 * time.Minute)
	h.do("PATCH", "/api/v10/channels/1", botA, `{"name":"again"}`).want(t, 200)

	st := h.srv.Stats()
	if st.Unavoidable != 1 || st.Avoidable != 0 || st.ByScope[ScopeUser] != 1 {
		t.Errorf("stats unavoidable %d avoidable %d user %d; want 1, 0, 1", st.Unavoidable, st.Avoidable, st.ByScope[ScopeUser])
	}
}

func TestSharedScope(t *testing.T) {
	t.Parallel()
	h := newHarness(t,
		WithSharedLimit(SharedLimit{Route: "POST /channels/{channel_id}/messages", Resource: "channels/9",
			Limit: 1, Window: 10 * time.Second, RetryAfter: 30 * time.Second}),
		WithInvalidRequestLimit(1, time.Minute))
	const path = "/api/v10/channels/9/messages"
	h.do("POST", path, botA, `{}`).want(t, 200)
	for _, auth := range []string{botA, botB, botA, botB} {
		r := h.do("POST", path, auth, `{}`)
		// Remaining can be above zero on a shared 429.
		r.want(t, 429, "X-RateLimit-Scope", "shared", "Retry-After", "30", "X-RateLimit-Global", "")
		if got := r.header.Get("X-RateLimit-Remaining"); got == "0" || got == "" {
			t.Errorf("X-RateLimit-Remaining = %q on a shared 429; want the bucket's own remaining", got)
		}
		if retry, global, _ := r.rateLimitBody(t); retry != 30 || global {
			t.Errorf("shared 429 body retry_after %v global %v; want 30, false", retry, global)
		}
	}
	// Other routes and channels are not busy; shared 429s are not invalid, so
	// no ban followed despite an invalid-request limit of 1.
	h.do("GET", path, botA, "").want(t, 200)
	h.do("POST", "/api/v10/channels/8/messages", botA, `{}`).want(t, 200)
	st := h.srv.Stats()
	if st.Invalid != 0 || st.Banned || st.ByScope[ScopeShared] != 4 || st.Unavoidable != 4 {
		t.Errorf("stats invalid %d banned %v shared %d unavoidable %d; want 0, false, 4, 4",
			st.Invalid, st.Banned, st.ByScope[ScopeShared], st.Unavoidable)
	}
	h.clock.Advance(10 * time.Second)
	h.do("POST", path, botB, `{}`).want(t, 200)
}

func TestUnderstatedLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 5, Window: 5 * time.Second, Announced: 2}))
	const path = "/api/v10/channels/1/messages"
	for _, remaining := range []string{"2", "2", "2", "1", "0"} {
		h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Limit", "2", "X-RateLimit-Remaining", remaining)
	}
	h.do("POST", path, botA, `{}`).want(t, 429, "X-RateLimit-Limit", "2")
}

func TestClockSkew(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithClockSkew(-3*time.Second))
	h.do("POST", "/api/v10/channels/1/messages", botA, `{}`).want(t, 200,
		"Date", "Tue, 14 Nov 2023 22:13:17 GMT",
		"X-RateLimit-Reset", "1699999998.000",
		"X-RateLimit-Reset-After", "1.000")
}

func TestInvalidRequestBan(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithTokens("good"), WithInvalidRequestLimit(3, time.Minute), WithBanDuration(time.Hour))
	for range 4 {
		r := h.do("GET", "/api/v10/users/@me", "Bot bad", "")
		r.want(t, 401, "Via", "1.1 google")
		if !strings.Contains(string(r.body), `"401: Unauthorized"`) {
			t.Errorf("401 body = %s", r.body)
		}
	}
	// More than three invalid requests within the window: banned, whatever
	// the token.
	r := h.do("GET", "/api/v10/users/@me", "Bot good", "")
	r.want(t, 429, append([]string{"Via", "", "Content-Type", "text/html; charset=UTF-8"}, noBucketHeaders()...)...)
	for name := range r.header {
		if strings.HasPrefix(strings.ToLower(name), "x-ratelimit") {
			t.Errorf("ban response has header %s", name)
		}
	}
	if !strings.Contains(string(r.body), "error code: 1015") || !strings.HasPrefix(string(r.body), "<!DOCTYPE html>") {
		t.Errorf("ban body = %q; want Cloudflare's HTML page", r.body)
	}
	st := h.srv.Stats()
	if !st.Banned || st.Bans != 1 || st.BannedResponses != 1 || st.Invalid != 4 || st.ByStatus[401] != 4 {
		t.Errorf("stats = %+v; want one ban, one banned response, 4 invalid", st)
	}
	if last := st.Log[len(st.Log)-1]; !last.Banned || last.Route != "GET /users/@me" || last.Status != 429 || last.Scope != "" {
		t.Errorf("log entry of the ban = %+v; want banned GET /users/@me 429 without scope", last)
	}
	h.clock.Advance(59 * time.Minute)
	h.do("GET", "/api/v10/users/@me", "Bot good", "").want(t, 429, "Content-Type", "text/html; charset=UTF-8")
	h.clock.Advance(time.Minute)
	h.do("GET", "/api/v10/users/@me", "Bot good", "").want(t, 200)
}

func TestInvalidRequestWindowSlides(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithTokens("good"), WithInvalidRequestLimit(3, time.Minute))
	for range 3 {
		h.do("GET", "/api/v10/users/@me", "Bot bad", "").want(t, 401)
	}
	h.clock.Advance(time.Minute)
	for range 3 {
		h.do("GET", "/api/v10/users/@me", "Bot bad", "").want(t, 401)
	}
	h.do("GET", "/api/v10/users/@me", "Bot good", "").want(t, 200)
	if st := h.srv.Stats(); st.Banned {
		t.Errorf("banned after 3 invalid requests per window")
	}
}

func TestUnauthorizedAndNotFound(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		opts       []Option
		live       func(*Server)
		method     string
		path, auth string
		wantStatus int
		wantCode   int
		wantMsg    string
	}{
		{"any token without a registry", nil, nil, "GET", "/api/v10/users/@me", "Bot anything", 200, 0, ""},
		{"registered token", []Option{WithTokens("Bot ok")}, nil, "GET", "/api/v10/users/@me", "Bot ok", 200, 0, ""},
		{"registered without prefix", []Option{WithTokens("ok")}, nil, "GET", "/api/v10/users/@me", "Bot ok", 200, 0, ""},
		{"unknown token", []Option{WithTokens("ok")}, nil, "GET", "/api/v10/users/@me", "Bot other", 401, 0, "401: Unauthorized"},
		{"invalid token", []Option{WithInvalidTokens("revoked")}, nil, "GET", "/api/v10/users/@me", "Bot revoked", 401, 0, "401: Unauthorized"},
		{"deleted channel", []Option{WithDeletedChannels("5")}, nil, "POST", "/api/v10/channels/5/messages", botA, 404, 10003, "Unknown Channel"},
		{"live deleted channel", nil, func(s *Server) { s.DeleteChannel("6") }, "GET", "/api/v10/channels/6/messages", botA, 404, 10003, "Unknown Channel"},
		{"deleted webhook", []Option{WithDeletedWebhooks("7")}, nil, "POST", "/api/v10/webhooks/7/tok", "", 404, 10015, "Unknown Webhook"},
		{"live deleted webhook", nil, func(s *Server) { s.DeleteWebhook("8") }, "POST", "/api/v10/webhooks/8/tok", "", 404, 10015, "Unknown Webhook"},
		{"other channel", []Option{WithDeletedChannels("5")}, nil, "POST", "/api/v10/channels/4/messages", botA, 200, 0, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tt.opts...)
			if tt.live != nil {
				tt.live(h.srv)
			}
			r := h.do(tt.method, tt.path, tt.auth, `{}`)
			r.want(t, tt.wantStatus)
			if tt.wantStatus == 200 {
				return
			}
			var body apiError
			if err := json.Unmarshal(r.body, &body); err != nil || body.Code != tt.wantCode || body.Message != tt.wantMsg {
				t.Errorf("body = %s (%v); want code %d message %q", r.body, err, tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func TestDeletedWebhookCountsAsInvalid(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithDeletedWebhooks("7"), WithDeletedChannels("5"), WithInvalidRequestLimit(2, time.Minute))
	h.do("GET", "/api/v10/channels/5/messages", botA, "").want(t, 404)
	h.do("POST", "/api/v10/webhooks/7/tok", "", `{}`).want(t, 404)
	h.do("POST", "/api/v10/webhooks/7/tok", "", `{}`).want(t, 404)
	h.do("POST", "/api/v10/webhooks/7/tok", "", `{}`).want(t, 404)
	h.do("GET", "/api/v10/gateway", "", "").want(t, 429, "Content-Type", "text/html; charset=UTF-8")
	if st := h.srv.Stats(); st.Invalid != 3 {
		t.Errorf("invalid = %d; want 3 (webhook 404s only)", st.Invalid)
	}
}

func TestLiveChanges(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const post, get = "/api/v10/channels/1/messages", "/api/v10/channels/1/messages"
	h.do("POST", post, botA, `{}`).want(t, 200, "X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4")
	if err := h.srv.SetBucket(Bucket{Hash: hashMessageCreate, Limit: 2, Window: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h.do("POST", post, botA, `{}`).want(t, 200, "X-RateLimit-Limit", "2", "X-RateLimit-Remaining", "0")
	h.do("POST", post, botA, `{}`).want(t, 429, "X-RateLimit-Limit", "2")

	// Moving the GET route onto the POST bucket makes it share the
	// exhausted counter.
	h.do("GET", get, botA, "").want(t, 200, "X-RateLimit-Bucket", hashMessageList)
	if err := h.srv.MoveRoute("GET /channels/{id}/messages", hashMessageCreate); err != nil {
		t.Fatal(err)
	}
	h.do("GET", get, botA, "").want(t, 429, "X-RateLimit-Bucket", hashMessageCreate, "X-RateLimit-Scope", "user")

	// A longer window refills more slowly.
	if err := h.srv.SetBucket(Bucket{Hash: hashMessageCreate, Limit: 2, Window: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(2500 * time.Millisecond)
	h.do("POST", post, botA, `{}`).want(t, 429)
	h.clock.Advance(2500 * time.Millisecond)
	h.do("POST", post, botA, `{}`).want(t, 200, "X-RateLimit-Reset-After", "10.000")

	if err := h.srv.MoveRoute("GET /x", "nope"); !errors.Is(err, ErrUnknownBucket) {
		t.Errorf("MoveRoute to an unknown hash = %v; want ErrUnknownBucket", err)
	}
	if err := h.srv.SetBucket(Bucket{Hash: "x"}); err == nil {
		t.Errorf("SetBucket with a zero limit succeeded")
	}
	// A new route can be added live.
	if err := h.srv.MoveRoute("GET /gateway", hashCurrentUser); err != nil {
		t.Fatal(err)
	}
	h.do("GET", "/api/v10/gateway", botA, "").want(t, 200, "X-RateLimit-Bucket", hashCurrentUser)
	// A global limit can be changed live.
	h.srv.SetGlobalLimit(1)
	h.clock.Advance(time.Second)
	h.do("GET", "/api/v10/users/@me", botB, "").want(t, 200)
	h.do("GET", "/api/v10/users/@me", botB, "").want(t, 429, "X-RateLimit-Scope", "global")
}

func TestSwitchFixedToSliding(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const path = "/api/v10/guilds/1/members/2"
	h.do("PATCH", path, botA, `{}`).want(t, 200, "X-RateLimit-Reset-After", "10.000")
	h.clock.Advance(time.Second)
	if err := h.srv.SetBucket(Bucket{Hash: hashMemberModify, Limit: 10, Window: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	// Sliding now: one request is one slot of one second.
	h.do("PATCH", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "9", "X-RateLimit-Reset-After", "1.000")
}

func TestUnmatchedRoute(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do("DELETE", "/api/v10/applications/1/commands/2", botA, "")
	r.want(t, 200, append([]string{"Via", "1.1 google", "Content-Type", "application/json"}, noBucketHeaders()...)...)
	if string(r.body) != "{}" {
		t.Errorf("body = %s; want {}", r.body)
	}
	if r.header.Get("Date") == "" {
		t.Errorf("no Date header")
	}
}

func TestSuccessBodies(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do("POST", "/api/v10/channels/42/messages", botA, `{"content":"hello"}`)
	r.want(t, 200, "Content-Type", "application/json")
	var msg struct {
		ID        string `json:"id"`
		ChannelID string `json:"channel_id"`
		Content   string `json:"content"`
		Type      *int   `json:"type"`
		Author    struct {
			ID  string `json:"id"`
			Bot bool   `json:"bot"`
		} `json:"author"`
		Timestamp string `json:"timestamp"`
	}
	if err := json.Unmarshal(r.body, &msg); err != nil {
		t.Fatalf("message %s: %v", r.body, err)
	}
	id, err := strconv.ParseInt(msg.ID, 10, 64)
	if err != nil || msg.ChannelID != "42" || msg.Content != "hello" || msg.Type == nil || *msg.Type != 0 || !msg.Author.Bot {
		t.Fatalf("message = %s; want a snowflake id, channel_id 42, content hello, type 0", r.body)
	}
	if created := time.UnixMilli(id>>22 + discordEpoch); !created.Equal(startTime()) {
		t.Errorf("snowflake time = %v; want %v", created, startTime())
	}
	r2 := h.do("POST", "/api/v10/channels/42/messages", botA, `{"content":"again"}`)
	if strings.Contains(string(r2.body), msg.ID) {
		t.Errorf("two messages share the id %s", msg.ID)
	}

	r = h.do("GET", "/api/v10/users/@me", botA, "")
	r.want(t, 200)
	var u user
	if err := json.Unmarshal(r.body, &u); err != nil || u.ID != botUserID || !u.Bot || u.Username == "" {
		t.Errorf("user = %s (%v); want the bot user", r.body, err)
	}

	h.do("PUT", "/api/v10/channels/42/messages/1/reactions/x:1/@me", botA, "").want(t, 204)
	h.do("DELETE", "/api/v10/channels/42/messages/1", botA, "").want(t, 204)
	h.do("POST", "/api/v10/webhooks/9/tok", "", `{"content":"hook"}`).want(t, 204)
	r = h.do("POST", "/api/v10/webhooks/9/tok?wait=true", "", `{"content":"hook"}`)
	r.want(t, 200)
	if !strings.Contains(string(r.body), `"content":"hook"`) || !strings.Contains(string(r.body), `"webhook_id":"9"`) {
		t.Errorf("webhook message = %s", r.body)
	}
}

func TestAvoidableStats(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithGlobalLimit(10),
		WithSharedLimit(SharedLimit{Resource: "channels/9", Limit: 1, Window: time.Minute}))
	for range 5 {
		h.do("POST", "/api/v10/channels/1/messages", botA, `{}`).want(t, 200)
	}
	// Sent once the client had read the headers: avoidable.
	h.clock.Advance(time.Millisecond)
	h.do("POST", "/api/v10/channels/1/messages", botA, `{}`).want(t, 429, "X-RateLimit-Scope", "user")
	h.do("PATCH", "/api/v10/channels/2", botA, `{"name":"a"}`).want(t, 200)
	h.do("PATCH", "/api/v10/channels/2", botA, `{"name":"b"}`).want(t, 200)
	h.do("PATCH", "/api/v10/channels/2", botA, `{"name":"c"}`).want(t, 429, "X-RateLimit-Scope", "user") // hidden
	h.do("POST", "/api/v10/channels/9/messages", botB, `{}`).want(t, 200)
	h.do("POST", "/api/v10/channels/9/messages", botB, `{}`).want(t, 429, "X-RateLimit-Scope", "shared")
	h.do("GET", "/api/v10/gateway", botA, "").want(t, 200)
	h.do("GET", "/api/v10/gateway", botA, "").want(t, 429, "X-RateLimit-Scope", "global") // avoidable

	st := h.srv.Stats()
	checks := []struct {
		name      string
		got, want int
	}{
		{"requests", st.Requests, 13},
		{"200s", st.ByStatus[200], 9},
		{"429s", st.ByStatus[429], 4},
		{"user", st.ByScope[ScopeUser], 2},
		{"global", st.ByScope[ScopeGlobal], 1},
		{"shared", st.ByScope[ScopeShared], 1},
		{"avoidable", st.Avoidable, 2},
		{"unavoidable", st.Unavoidable, 2},
		{"invalid", st.Invalid, 3},
		{"successes channels/1", st.Successes[BucketKey{Hash: hashMessageCreate, Major: "channels/1"}], 5},
		{"successes channels/2", st.Successes[BucketKey{Hash: hashChannelModify, Major: "channels/2"}], 2},
		{"successes channels/9", st.Successes[BucketKey{Hash: hashMessageCreate, Major: "channels/9"}], 1},
		{"log", len(st.Log), 13},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d; want %d", c.name, c.got, c.want)
		}
	}
	if len(st.Log) == 13 {
		e := st.Log[5]
		want := LogEntry{Time: startTime().Add(time.Millisecond), Method: "POST", Route: "POST /channels/{channel_id}/messages", Bucket: hashMessageCreate,
			Major: "channels/1", Credential: h.srv.CredentialID(botA), Status: 429, Scope: ScopeUser, Avoidable: true,
			RetryAfter: 999 * time.Millisecond, Reached: startTime().Add(time.Millisecond)}
		if e != want {
			t.Errorf("log[5] = %+v; want %+v", e, want)
		}
		if e := st.Log[8]; e.Scope != ScopeUser || e.Avoidable {
			t.Errorf("log[8] = %+v; want an unavoidable user 429", e)
		}
	}

	h.srv.ResetStats()
	if st := h.srv.Stats(); st.Requests != 0 || len(st.Log) != 0 || st.Avoidable != 0 || len(st.ByStatus) != 0 {
		t.Errorf("after ResetStats: %+v", st)
	}
	// ResetStats keeps the counters; ResetLimits clears them.
	h.do("POST", "/api/v10/channels/1/messages", botA, `{}`).want(t, 429)
	h.srv.ResetLimits()
	h.do("POST", "/api/v10/channels/1/messages", botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "4")
}

func TestFirstRequestRaceIsUnavoidable(t *testing.T) {
	t.Parallel()
	// With latency, the first response reaches the client only after the
	// latency's second half: a request sent before that could not know.
	// The clock is fake and stands still; the latency's timers are real.
	clk := &fakeClock{t: startTime()}
	h := startHarness(t, []Option{withClock(clk.Now), WithLatency(20*time.Millisecond, 0),
		WithBuckets(Bucket{Hash: hashMemberModify, Limit: 1, Window: 10 * time.Second, Fixed: true})})
	h.clock = clk
	const path = "/api/v10/guilds/1/members/2"
	h.do("PATCH", path, botA, `{}`).want(t, 200)
	h.do("PATCH", path, botA, `{}`).want(t, 429) // sent at the same instant of the emulator's clock
	h.clock.Advance(11 * time.Millisecond)
	h.do("PATCH", path, botA, `{}`).want(t, 429) // sent once the first response had arrived and been read
	st := h.srv.Stats()
	if st.Unavoidable != 1 || st.Avoidable != 1 {
		t.Errorf("unavoidable %d avoidable %d; want 1, 1", st.Unavoidable, st.Avoidable)
	}
}

func TestRequestLogRedaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const botToken = "Bot secret-bot-token"
	h.do("POST", "/api/v10/webhooks/77/secret-webhook-token", "", `{"content":"x"}`).want(t, 204)
	h.do("GET", "/api/v10/webhooks/77/secret-webhook-token/messages/@original", "", "").want(t, 200)
	h.do("POST", "/api/v10/interactions/5/secret-interaction-token/callback", botToken, `{"type":4}`).want(t, 204)

	st := h.srv.Stats()
	if dump := fmt.Sprintf("%+v", st); strings.Contains(dump, "secret") {
		t.Fatalf("stats contain a token: %s", dump)
	}
	want := []struct{ route, major, cred string }{
		{"POST /webhooks/{webhook_id}/{webhook_token}", "webhooks/77/REDACTED", "ip:127.0.0.1"},
		{"GET /webhooks/77/REDACTED/messages/@original", "webhooks/77/REDACTED", "ip:127.0.0.1"},
		{"POST /interactions/{interaction_id}/{interaction_token}/callback", "interactions/5/REDACTED", h.srv.CredentialID(botToken)},
	}
	if len(st.Log) != len(want) {
		t.Fatalf("log has %d entries; want %d", len(st.Log), len(want))
	}
	for i, w := range want {
		if e := st.Log[i]; e.Route != w.route || e.Major != w.major || e.Credential != w.cred {
			t.Errorf("log[%d] = %+v; want route %q major %q credential %q", i, e, w.route, w.major, w.cred)
		}
	}
	if id := h.srv.CredentialID(botToken); !regexp.MustCompile(`^cred:[0-9a-f]{12}$`).MatchString(id) || id == h.srv.CredentialID(botA) {
		t.Errorf("CredentialID = %q; want a short hash that tells credentials apart", id)
	}
}

func TestLogLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithLogLimit(3))
	for i := range 10 {
		h.do("GET", fmt.Sprintf("/api/v10/channels/%d/messages", i), botA, "").want(t, 200)
	}
	st := h.srv.Stats()
	if len(st.Log) != 3 || st.LogDropped != 7 {
		t.Fatalf("log length %d dropped %d; want 3, 7", len(st.Log), st.LogDropped)
	}
	for i, e := range st.Log {
		if want := fmt.Sprintf("channels/%d", 7+i); e.Major != want {
			t.Errorf("log[%d].Major = %q; want %q", i, e.Major, want)
		}
	}

	none := newHarness(t, WithLogLimit(0))
	none.do("GET", "/api/v10/gateway", botA, "").want(t, 200)
	if st := none.srv.Stats(); len(st.Log) != 0 || st.Requests != 1 {
		t.Errorf("with no log: log %d requests %d; want 0, 1", len(st.Log), st.Requests)
	}
}

func TestIdleCountersAreDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithTokens("good"), WithInvalidRequestLimit(100, time.Minute), WithBanDuration(time.Minute))
	for i := range 50 {
		h.do("POST", fmt.Sprintf("/api/v10/channels/%d/messages", i), "Bot good", `{}`).want(t, 200)
	}
	h.do("GET", "/api/v10/users/@me", "Bot bad", "").want(t, 401)
	h.srv.mu.Lock()
	before := len(h.srv.counters)
	h.srv.mu.Unlock()
	if before < 50 {
		t.Fatalf("%d counters after 50 channels; want at least 50", before)
	}
	h.clock.Advance(2 * time.Minute)
	h.do("GET", "/api/v10/gateway", "Bot good", "").want(t, 200)
	h.srv.mu.Lock()
	defer h.srv.mu.Unlock()
	// Only the global counter of the last request is left.
	if n, d := len(h.srv.counters), len(h.srv.delivered); n != 1 || d != 0 {
		t.Errorf("after the windows passed: %d counters, %d delivered; want 1, 0", n, d)
	}
}

func TestLatency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		opts     []Option
		min, max time.Duration
	}{
		{"fixed", []Option{WithLatency(80*time.Millisecond, 0)}, 75 * time.Millisecond, 5 * time.Second},
		{"scaled", []Option{WithLatency(time.Second, 0), WithTimeScale(0.1)}, 95 * time.Millisecond, 900 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newRealHarness(t, tt.opts...)
			begin := time.Now()
			h.do("GET", "/api/v10/users/@me", botA, "").want(t, 200)
			if d := time.Since(begin); d < tt.min || d > tt.max {
				t.Errorf("request took %v; want between %v and %v", d, tt.min, tt.max)
			}
		})
	}
}

func TestJitterRange(t *testing.T) {
	t.Parallel()
	s, err := newServer([]Option{WithLatency(10*time.Millisecond, 20*time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	seen := make(map[time.Duration]bool)
	for range 200 {
		up, down := s.delays.draw()
		for _, d := range []time.Duration{up, down} {
			if d < 5*time.Millisecond || d > 15*time.Millisecond {
				t.Fatalf("delays.draw() = %v, %v; want each leg in [5ms, 15ms]", up, down)
			}
		}
		seen[up] = true
	}
	if len(seen) < 10 {
		t.Errorf("only %d distinct delays in 200 draws; want jitter", len(seen))
	}
}

func TestTimeScale(t *testing.T) {
	t.Parallel()
	h := newRealHarness(t, WithTimeScale(0.1))
	const path = "/api/v10/channels/1/messages"
	// A 5/5s sliding bucket becomes 5/0.5s: a slot is 0.1 s.
	h.do("POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Limit", "5", "X-RateLimit-Reset-After", "0.100")
	var limited *reply
	for range 20 {
		r := h.do("POST", path, botA, `{}`)
		if r.status == 429 {
			limited = r
			break
		}
		if ra, _ := strconv.ParseFloat(r.header.Get("X-RateLimit-Reset-After"), 64); ra > 0.5 {
			t.Fatalf("X-RateLimit-Reset-After = %v; want at most the scaled window 0.5", ra)
		}
	}
	if limited == nil {
		t.Fatal("no 429 after 21 requests")
	}
	retry, _, _ := limited.rateLimitBody(t)
	if retry <= 0 || retry > 0.1 {
		t.Fatalf("retry_after = %v; want at most one scaled slot, 0.1", retry)
	}
	time.Sleep(time.Duration(retry*float64(time.Second)) + 20*time.Millisecond)
	h.do("POST", path, botA, `{}`).want(t, 200)
}

func TestConcurrentUse(t *testing.T) {
	t.Parallel()
	h := newRealHarness(t, WithTimeScale(0.01), WithLogLimit(50))
	const workers, each = 6, 30
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				path := fmt.Sprintf("/api/v10/channels/%d/messages", i%3)
				if i%7 == 0 {
					h.srv.Stats()
				}
				req, _ := http.NewRequest("POST", h.srv.URL()+path, strings.NewReader(`{"content":"x"}`))
				req.Header.Set("Authorization", fmt.Sprintf("Bot w%d", w%2))
				resp, err := h.client.Do(req)
				if err != nil {
					t.Errorf("request: %v", err)
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Go(func() {
		for i := range 20 {
			_ = h.srv.SetBucket(Bucket{Hash: hashMessageCreate, Limit: 3 + i%3, Window: 5 * time.Second})
			_ = h.srv.MoveRoute("POST /channels/{id}/messages", []string{hashMessageCreate, hashMessageList}[i%2])
			h.srv.SetGlobalLimit(40 + i)
		}
	})
	wg.Wait()
	st := h.srv.Stats()
	sum := 0
	for _, n := range st.ByStatus {
		sum += n
	}
	if st.Requests != workers*each || sum != st.Requests || len(st.Log) != 50 {
		t.Errorf("requests %d, by status %d, log %d; want %d, %d, 50", st.Requests, sum, len(st.Log), workers*each, workers*each)
	}
}

func TestCloseIsIdempotent(t *testing.T) {
	t.Parallel()
	s := NewServer(WithLatency(time.Hour, 0))
	url := s.URL()
	done := make(chan error, 1)
	go func() {
		resp, err := http.Get(url + "/api/v10/users/@me")
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the request reach its latency
	begin := time.Now()
	s.Close()
	s.Close()
	if d := time.Since(begin); d > 3*time.Second {
		t.Errorf("Close took %v despite an hour of latency", d)
	}
	<-done
	if _, err := http.Get(url + "/api/v10/users/@me"); err == nil {
		t.Errorf("request after Close succeeded")
	}
	http.DefaultClient.CloseIdleConnections()
}

func TestNewServerPanicsOnBadOption(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Errorf("NewServer with a non-loopback address did not panic")
		}
	}()
	s := NewServer(WithAddr("0.0.0.0:0"))
	s.Close()
}

func TestLimitChangeIsUnavoidableUntilAnnounced(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	const post = "/api/v10/channels/1/messages"
	for range 3 {
		h.do("POST", post, botA, `{}`).want(t, 200, "X-RateLimit-Limit", "5")
	}
	// The limit drops below what the window already used: the client was
	// told 2 remain, so its next request cannot have avoided the 429.
	if err := h.srv.SetBucket(Bucket{Hash: hashMessageCreate, Limit: 2, Window: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	h.do("POST", post, botA, `{}`).want(t, 429, "X-RateLimit-Limit", "2", "X-RateLimit-Remaining", "0")
	// That 429 announced the new limit: the next one, sent once the client
	// had read it, was avoidable.
	h.clock.Advance(time.Millisecond)
	h.do("POST", post, botA, `{}`).want(t, 429, "X-RateLimit-Scope", "user")
	if st := h.srv.Stats(); st.Unavoidable != 1 || st.Avoidable != 1 {
		t.Errorf("stats unavoidable %d avoidable %d; want 1 and 1", st.Unavoidable, st.Avoidable)
	}
}

func TestFirstRequestOfASharingRouteIsUnavoidable(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	for range 10 {
		h.do("PATCH", "/api/v10/guilds/1/members/2", botA, `{}`).want(t, 200, "X-RateLimit-Bucket", hashMemberModify)
	}
	// The roles route shares the exhausted bucket, but the client has never
	// been told so: its first 429 could not have been avoided; its second,
	// sent once the client had read the first, could.
	h.do("PUT", "/api/v10/guilds/1/members/2/roles/3", botA, "").want(t, 429, "X-RateLimit-Bucket", hashMemberModify)
	h.clock.Advance(time.Millisecond)
	h.do("PUT", "/api/v10/guilds/1/members/2/roles/3", botA, "").want(t, 429, "X-RateLimit-Bucket", hashMemberModify)
	if st := h.srv.Stats(); st.Unavoidable != 1 || st.Avoidable != 1 {
		t.Errorf("stats unavoidable %d avoidable %d; want 1 and 1", st.Unavoidable, st.Avoidable)
	}
}
