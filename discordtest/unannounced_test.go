package discordtest

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

// wantEdgeBlock checks that a reply is an edge limit's block: 429 with
// Cloudflare's static JSON and no rate-limit headers, Via or Retry-After.
func (r *reply) wantEdgeBlock(t *testing.T) {
	t.Helper()
	r.want(t, 429, append([]string{"Via", "", "Retry-After", "", "X-RateLimit-Scope", "", "X-RateLimit-Global", "",
		"Content-Type", "application/json"}, noBucketHeaders()...)...)
	for name := range r.header {
		if strings.HasPrefix(strings.ToLower(name), "x-ratelimit") {
			t.Errorf("block response has header %s", name)
		}
	}
	var b map[string]any
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatalf("block body %s: %v", r.body, err)
	}
	msg, _ := b["message"].(string)
	if code, ok := b["code"].(float64); !ok || code != 0 || len(b) != 2 ||
		!strings.HasPrefix(msg, "You are being blocked from accessing our API temporarily") {
		t.Errorf("block body = %s; want code 0, the blocking message and nothing else", r.body)
	}
}

func TestEdgeLimitBlocksAnIPAcrossTokens(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithEdgeLimit(EdgeLimit{Route: "GET /channels/{channel_id}/messages", Limit: 2, Window: time.Second,
		Block: 5 * time.Second}))
	const path = "/api/v10/channels/1/messages"
	h.do("GET", path, botA, "").want(t, 200, "Via", "1.1 google")
	h.do("GET", "/api/v10/channels/2/messages", botB, "").want(t, 200) // every token and channel counts
	h.do("GET", path, botA, "").wantEdgeBlock(t)                       // the first of the episode: unavoidable
	// The block covers the limit's routes only, for every token.
	h.do("POST", path, botA, `{}`).want(t, 200)
	h.clock.Advance(time.Second)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // a probe a second later: unavoidable
	h.do("GET", path, botA, "").wantEdgeBlock(t) // at once after it: avoidable
	h.clock.Advance(3999 * time.Millisecond)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // still blocked; a lone probe
	h.clock.Advance(time.Millisecond)
	h.do("GET", path, botA, "").want(t, 200) // the block lasted 5 s

	st := h.srv.Stats()
	if st.EdgeBlocks != 4 || st.ByStatus[429] != 4 || st.Unavoidable != 3 || st.Avoidable != 1 || len(st.ByScope) != 0 ||
		st.Invalid != 0 || st.Bans != 0 {
		t.Errorf("stats = %+v; want 4 edge blocks (429s without scope), 3 unavoidable, 1 avoidable, nothing invalid, no ban", st)
	}
	var edge []bool
	for _, e := range st.Log {
		if e.Edge {
			edge = append(edge, e.Avoidable)
		}
	}
	if len(edge) != 4 || edge[0] || edge[1] || !edge[2] || edge[3] {
		t.Errorf("avoidable of the logged blocks = %v; want [false false true false]", edge)
	}
}

func TestEdgeLimitBansAHammeringIP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithEdgeLimit(EdgeLimit{Limit: 1, Window: time.Second, Block: 10 * time.Second, BanAfter: 3}),
		WithBanDuration(time.Hour))
	h.do("GET", "/api/v10/users/@me", botA, "").want(t, 200)
	h.do("GET", "/api/v10/gateway", botB, "").wantEdgeBlock(t) // an edge limit without a route covers every route
	h.clock.Advance(time.Millisecond)                          // the client has read it
	for range 3 {
		h.do("GET", "/api/v10/users/@me", botA, "").wantEdgeBlock(t)
	}
	if st := h.srv.Stats(); st.Bans != 0 {
		t.Fatalf("banned after 3 requests into the block; the limit is more than 3")
	}
	h.do("GET", "/api/v10/users/@me", botB, "").wantEdgeBlock(t) // the fourth: banned from the next request on
	r := h.do("GET", "/api/v10/users/@me", botA, "")
	r.want(t, 429, "Content-Type", "text/html; charset=UTF-8", "Via", "")
	if !strings.Contains(string(r.body), "error code: 1015") {
		t.Errorf("ban body = %q; want Cloudflare's 1015 page", r.body)
	}
	st := h.srv.Stats()
	if !st.Banned || st.Bans != 1 || st.BannedResponses != 1 || st.EdgeBlocks != 5 || st.Avoidable != 4 || st.Unavoidable != 1 {
		t.Errorf("stats = %+v; want a ban, 1 banned response, 5 edge blocks of which 4 avoidable", st)
	}
	// Other IPs are neither blocked nor banned.
	if rec := serve(h.srv, "GET", "/api/v10/users/@me", botA, "10.0.0.2:1234"); rec.Code != 200 {
		t.Errorf("another IP got %d; want 200", rec.Code)
	}
	h.clock.Advance(time.Hour)
	h.do("GET", "/api/v10/users/@me", botA, "").want(t, 200)
}

func TestEdgeLimitProbeWhileAnotherIsInFlight(t *testing.T) {
	t.Parallel()
	// The clock is fake and stands still unless advanced; the latency's
	// timers are real: responses reach the client 10 ms after the decision.
	clk := &fakeClock{t: startTime()}
	h := startHarness(t, []Option{withClock(clk.Now), WithLatency(20*time.Millisecond, 0),
		WithEdgeLimit(EdgeLimit{Limit: 1, Window: time.Minute, Block: time.Minute, BanAfter: -1})})
	h.clock = clk
	const path = "/api/v10/users/@me"
	h.do("GET", path, botA, "").want(t, 200)
	h.do("GET", path, botA, "").wantEdgeBlock(t) // unavoidable, reaches the client 10 ms later
	h.do("GET", path, botB, "").wantEdgeBlock(t) // sent before: unavoidable
	h.clock.Advance(time.Second + 10*time.Millisecond)
	h.do("GET", path, botA, "").wantEdgeBlock(t) // a probe a second after both: unavoidable
	h.do("GET", path, botB, "").wantEdgeBlock(t) // sent while the probe awaits its answer: avoidable
	h.clock.Advance(10 * time.Millisecond)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // right after the answers: avoidable
	h.clock.Advance(990 * time.Millisecond)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // 990 ms after the last answer: avoidable
	h.clock.Advance(1010 * time.Millisecond)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // a second after the last answer (to the one before): unavoidable
	st := h.srv.Stats()
	if st.EdgeBlocks != 7 || st.Unavoidable != 4 || st.Avoidable != 3 || st.Bans != 0 {
		t.Errorf("stats = %+v; want 7 edge blocks, 4 unavoidable, 3 avoidable, no ban (BanAfter < 0)", st)
	}
}

func TestEdgeLimitOption(t *testing.T) {
	t.Parallel()
	for _, l := range []EdgeLimit{
		{Limit: 0, Window: time.Second, Block: time.Second},
		{Limit: 1, Window: 0, Block: time.Second},
		{Limit: 1, Window: time.Second, Block: -time.Second},
		{Route: "users/@me", Limit: 1, Window: time.Second, Block: time.Second},
	} {
		if _, err := Start(WithEdgeLimit(l)); err == nil {
			t.Errorf("Start(WithEdgeLimit(%+v)) succeeded; want an error", l)
		}
	}
}

func TestClaimedHeaders(t *testing.T) {
	t.Parallel()
	// Reactions: the headers claim 200 with a long reset; the real limit is
	// one per 250 ms.
	h := newHarness(t, WithBuckets(Bucket{Hash: hashReaction, Limit: 1, Window: 250 * time.Millisecond,
		Claim: Claim{Limit: 200, Remaining: 199, ResetAfter: 10 * time.Minute}}))
	const path = "/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me"
	claimed := []string{"X-RateLimit-Limit", "200", "X-RateLimit-Remaining", "199", "X-RateLimit-Reset-After", "600.000",
		"X-RateLimit-Bucket", hashReaction}
	h.do("PUT", path, botA, "").want(t, 204, append([]string{"X-RateLimit-Reset", "1700000600.000"}, claimed...)...)
	r := h.do("PUT", path, botA, "") // the first 429: the headers said there was room
	r.want(t, 429, append([]string{"X-RateLimit-Scope", "user"}, claimed...)...)
	if retry, _, _ := r.rateLimitBody(t); retry != 0.25 {
		t.Errorf("retry_after = %v; want the real wait, 0.25", retry)
	}
	h.clock.Advance(time.Millisecond)                    // the client has read it
	h.do("PUT", path, botA, "").want(t, 429, claimed...) // a repeat: avoidable
	h.clock.Advance(250 * time.Millisecond)
	h.do("PUT", path, botA, "").want(t, 204, claimed...)
	h.do("PUT", path, botA, "").want(t, 429) // the client had been told: avoidable
	// Another channel and another credential have their own first 429.
	h.do("PUT", "/api/v10/channels/3/messages/2/reactions/x/@me", botA, "").want(t, 204)
	h.do("PUT", "/api/v10/channels/3/messages/2/reactions/x/@me", botA, "").want(t, 429)
	h.do("PUT", path, botB, "").want(t, 204)
	h.do("PUT", path, botB, "").want(t, 429)
	st := h.srv.Stats()
	if st.Unavoidable != 3 || st.Avoidable != 2 || st.ByScope[ScopeUser] != 5 {
		t.Errorf("stats unavoidable %d avoidable %d user %d; want 3, 2, 5", st.Unavoidable, st.Avoidable, st.ByScope[ScopeUser])
	}

	// The guild bans list: after one request, 5, 0 and 60 s; the real limit
	// lets more through.
	h = newHarness(t, WithBuckets(Bucket{Hash: "bans", Limit: 3, Window: time.Second,
		Claim: Claim{Limit: 5, Remaining: 0, ResetAfter: time.Minute}}),
		WithRoutes(Route{Template: "GET /guilds/{guild_id}/bans", Bucket: "bans"}))
	for range 3 {
		h.do("GET", "/api/v10/guilds/1/bans", botA, "").want(t, 200,
			"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "60.000")
	}
	h.do("GET", "/api/v10/guilds/1/bans", botA, "").want(t, 429, "X-RateLimit-Remaining", "0")

	if _, err := Start(WithBuckets(Bucket{Hash: "x", Limit: 1, Window: time.Second, Claim: Claim{Limit: 1, Remaining: 2}})); err == nil {
		t.Error("a claim with more remaining than its limit was accepted")
	}
}

func TestHiddenSublimitJudgement(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithHiddenSublimit(2, time.Minute))
	const path = "/api/v10/channels/1"
	h.do("PATCH", path, botA, `{"name":"a"}`).want(t, 200)
	h.do("PATCH", path, botA, `{"name":"b"}`).want(t, 200)
	h.do("PATCH", path, botA, `{"name":"c"}`).want(t, 429, "X-RateLimit-Scope", "user") // unavoidable
	h.do("PATCH", path, botA, `{"position":1}`).want(t, 200)                            // not a rename: not limited
	h.clock.Advance(30 * time.Second)
	h.do("PATCH", path, botA, `{"topic":"d"}`).want(t, 429) // retry_after had not run out: avoidable
	h.do("PATCH", path, botB, `{"name":"e"}`).want(t, 429)  // another credential had not been told: unavoidable
	h.do("PATCH", "/api/v10/channels/2", botA, `{"name":"f"}`).want(t, 200)
	h.clock.Advance(30 * time.Second)
	h.do("PATCH", path, botA, `{"name":"g"}`).want(t, 200)
	st := h.srv.Stats()
	if st.Unavoidable != 2 || st.Avoidable != 1 || st.ByScope[ScopeUser] != 3 {
		t.Errorf("stats unavoidable %d avoidable %d user %d; want 2, 1, 3", st.Unavoidable, st.Avoidable, st.ByScope[ScopeUser])
	}
	var renames int
	for _, e := range st.Log {
		if e.Renames {
			renames++
		}
	}
	if renames != 7 {
		t.Errorf("%d log entries mark a rename; want 7", renames)
	}
}

// TestHiddenSublimitReaction: a rename sent within a millisecond of the
// sublimit 429 was already on its way; one sent later was not.
func TestHiddenSublimitReaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithHiddenSublimit(1, time.Minute))
	const path = "/api/v10/channels/1"
	h.do("PATCH", path, botA, `{"name":"a"}`).want(t, 200)
	h.do("PATCH", path, botA, `{"name":"b"}`).want(t, 429) // unavoidable
	h.clock.Advance(500 * time.Microsecond)
	h.do("PATCH", path, botA, `{"name":"c"}`).want(t, 429) // within the reaction time: unavoidable
	h.clock.Advance(2 * time.Millisecond)
	h.do("PATCH", path, botA, `{"name":"d"}`).want(t, 429) // after it: avoidable
	if st := h.srv.Stats(); st.Unavoidable != 2 || st.Avoidable != 1 {
		t.Errorf("stats unavoidable %d avoidable %d; want 2 and 1", st.Unavoidable, st.Avoidable)
	}
}

func TestUnannouncedStateIsDropped(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithHiddenSublimit(1, time.Minute),
		WithEdgeLimit(EdgeLimit{Limit: 1, Window: time.Second, Block: time.Second}),
		WithBuckets(Bucket{Hash: hashReaction, Limit: 1, Window: time.Second, Claim: Claim{Limit: 9, Remaining: 9}}))
	// One client IP per request but the first two, so the edge limit blocks
	// only the second.
	ip := func(i int) string { return "10.0.0." + string(rune('1'+i)) + ":1" }
	serve(h.srv, "GET", "/api/v10/gateway", botA, ip(0))
	reqs := []struct{ method, path, body string }{
		{"PUT", "/api/v10/channels/1/messages/2/reactions/x/@me", ""},
		{"PUT", "/api/v10/channels/1/messages/2/reactions/x/@me", ""},
		{"PATCH", "/api/v10/channels/1", `{"name":"a"}`},
		{"PATCH", "/api/v10/channels/1", `{"name":"b"}`},
	}
	for i, q := range reqs {
		req, _ := http.NewRequest(q.method, q.path, strings.NewReader(q.body))
		req.Header.Set("Authorization", botA)
		req.RemoteAddr = ip(i + 1)
		h.srv.ServeHTTP(discard{}, req)
	}
	serve(h.srv, "GET", "/api/v10/gateway", botA, ip(0))
	h.srv.mu.Lock()
	claim, rename, edge := len(h.srv.claimTold), len(h.srv.renameTold), len(h.srv.edgeBlocks)
	h.srv.mu.Unlock()
	if claim != 1 || rename != 1 || edge != 1 {
		t.Fatalf("claim %d rename %d edge %d remembered; want 1 each", claim, rename, edge)
	}
	h.clock.Advance(2 * time.Minute)
	serve(h.srv, "GET", "/api/v10/gateway", botB, "10.0.0.9:1")
	h.srv.mu.Lock()
	defer h.srv.mu.Unlock()
	if n := len(h.srv.claimTold) + len(h.srv.renameTold) + len(h.srv.edgeBlocks); n != 0 {
		t.Errorf("%d entries left after every window passed; want 0", n)
	}
}

// discard is a ResponseWriter that keeps nothing.
type discard struct{}

func (discard) Header() http.Header         { return http.Header{} }
func (discard) Write(b []byte) (int, error) { return len(b), nil }
func (discard) WriteHeader(int)             {}

// TestEdgeLimitReaction: a request sent within a millisecond of the first
// block response was already on its way; one sent later was not.
func TestEdgeLimitReaction(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithEdgeLimit(EdgeLimit{Limit: 1, Window: time.Second, Block: 10 * time.Second, BanAfter: -1}))
	const path = "/api/v10/users/@me"
	h.do("GET", path, botA, "").want(t, 200)
	h.do("GET", path, botA, "").wantEdgeBlock(t)
	h.clock.Advance(500 * time.Microsecond)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // within the reaction time: unavoidable
	h.clock.Advance(2 * time.Millisecond)
	h.do("GET", path, botB, "").wantEdgeBlock(t) // after it: avoidable
	if st := h.srv.Stats(); st.Unavoidable != 2 || st.Avoidable != 1 {
		t.Errorf("stats = %+v; want 2 unavoidable and 1 avoidable block", st)
	}
}
