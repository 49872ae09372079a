package discordtest

import (
	"encoding/json"
	"net/http"
	"testing"
)

func TestGlobalLimitFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name           string
		maxConcurrency int
		want           int
	}{
		{"zero counts as one", 0, 50},
		{"one", 1, 50},
		{"two: the floor of 500", 2, 500},
		{"sixteen: the floor of 500", 16, 500},
		{"twenty: exactly 500", 20, 500},
		{"thirty-two", 32, 800},
		{"sixty-four", 64, 1600},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := GlobalLimitFor(tt.maxConcurrency); got != tt.want {
				t.Errorf("GlobalLimitFor(%d) = %d; want %d", tt.maxConcurrency, got, tt.want)
			}
		})
	}
}

// gatewayBotReply is GET /gateway/bot's body as a client decodes it, every
// field a pointer so a missing one shows.
type gatewayBotReply struct {
	URL               *string `json:"url"`
	Shards            *int    `json:"shards"`
	SessionStartLimit *struct {
		Total          *int   `json:"total"`
		Remaining      *int   `json:"remaining"`
		ResetAfter     *int64 `json:"reset_after"`
		MaxConcurrency *int   `json:"max_concurrency"`
	} `json:"session_start_limit"`
}

// getGatewayBot sends GET path with a bot token, checks the body has every
// field Discord sends, and returns its max_concurrency.
func getGatewayBot(t *testing.T, h *harness, path string) int {
	t.Helper()
	r := h.do("GET", path, botA, "")
	r.want(t, 200, append([]string{"Content-Type", "application/json", "Via", "1.1 google"}, noBucketHeaders()...)...)
	var b gatewayBotReply
	if err := json.Unmarshal(r.body, &b); err != nil {
		t.Fatalf("GET %s: body %s: %v", path, r.body, err)
	}
	l := b.SessionStartLimit
	if b.URL == nil || b.Shards == nil || l == nil || l.Total == nil || l.Remaining == nil || l.ResetAfter == nil || l.MaxConcurrency == nil {
		t.Fatalf("GET %s = %s; want url, shards and session_start_limit with total, remaining, reset_after and max_concurrency", path, r.body)
	}
	if *b.URL != "wss://gateway.discord.gg" || *b.Shards != *l.MaxConcurrency || *l.Total != 1000 || *l.Remaining != 1000 || *l.ResetAfter != 0 {
		t.Errorf("GET %s = %s; want Discord's gateway URL, %d shards, 1000 of 1000 session starts left, reset_after 0",
			path, r.body, *l.MaxConcurrency)
	}
	return *l.MaxConcurrency
}

// wantGlobalLimit checks that botA, having sent sent requests in this
// second, may send limit in all before its first global 429. The clock does
// not move, so every request falls in one second.
func wantGlobalLimit(t *testing.T, h *harness, sent, limit int) {
	t.Helper()
	for i := sent; i < limit; i++ {
		if rec := serve(h.srv, "GET", "/api/v10/gateway", botA, "10.0.0.1:5000"); rec.Code != http.StatusOK {
			t.Fatalf("request %d of a global limit of %d: status %d; want 200", i+1, limit, rec.Code)
		}
	}
	rec := serve(h.srv, "GET", "/api/v10/gateway", botA, "10.0.0.1:5000")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("X-RateLimit-Scope") != ScopeGlobal {
		t.Fatalf("request %d of a global limit of %d: status %d scope %q; want 429 global",
			limit+1, limit, rec.Code, rec.Header().Get("X-RateLimit-Scope"))
	}
}

func TestGatewayBotMaxConcurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		opts       []Option
		wantMax    int
		wantGlobal int
	}{
		{"default", nil, 1, 50},
		{"one", []Option{WithMaxConcurrency(1)}, 1, 50},
		{"below one counts as one", []Option{WithMaxConcurrency(0)}, 1, 50},
		{"sixteen", []Option{WithMaxConcurrency(16)}, 16, 500},
		{"thirty-two", []Option{WithMaxConcurrency(32)}, 32, 800},
		// Whichever option comes later sets the global limit.
		{"global limit after", []Option{WithMaxConcurrency(16), WithGlobalLimit(50)}, 16, 50},
		{"global limit before", []Option{WithGlobalLimit(10), WithMaxConcurrency(16)}, 16, 500},
		{"global limit alone", []Option{WithGlobalLimit(120)}, 1, 120},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, tt.opts...)
			paths := []string{"/api/v10/gateway/bot", "/api/gateway/bot", "/gateway/bot"}
			for _, p := range paths {
				if got := getGatewayBot(t, h, p); got != tt.wantMax {
					t.Errorf("GET %s: max_concurrency %d; want %d", p, got, tt.wantMax)
				}
			}
			// The three requests above count towards the global limit.
			wantGlobalLimit(t, h, len(paths), tt.wantGlobal)
		})
	}
}

func TestSetMaxConcurrency(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	h.srv.SetMaxConcurrency(32)
	if got := getGatewayBot(t, h, "/api/v10/gateway/bot"); got != 32 {
		t.Errorf("after SetMaxConcurrency(32): max_concurrency %d; want 32", got)
	}
	wantGlobalLimit(t, h, 1, 800)

	// SetGlobalLimit changes the limit but not what /gateway/bot reports.
	h.srv.ResetLimits()
	h.srv.SetGlobalLimit(60)
	if got := getGatewayBot(t, h, "/api/v10/gateway/bot"); got != 32 {
		t.Errorf("after SetGlobalLimit(60): max_concurrency %d; want 32", got)
	}
	wantGlobalLimit(t, h, 1, 60)
}

func TestGatewayBotNeedsAToken(t *testing.T) {
	t.Parallel()
	h := newHarness(t)
	r := h.do("GET", "/api/v10/gateway/bot", "", "")
	r.want(t, 401)
	var body apiError
	if err := json.Unmarshal(r.body, &body); err != nil || body.Message != "401: Unauthorized" {
		t.Errorf("GET /gateway/bot without a token: body %s; want Discord's 401", r.body)
	}
	// GET /gateway needs none.
	r = h.do("GET", "/api/v10/gateway", "", "")
	r.want(t, 200)
	var g struct {
		URL string `json:"url"`
	}
	if err := json.Unmarshal(r.body, &g); err != nil || g.URL != "wss://gateway.discord.gg" {
		t.Errorf("GET /gateway = %s; want Discord's gateway URL", r.body)
	}
	if st := h.srv.Stats(); st.ByStatus[401] != 1 {
		t.Errorf("stats: %d 401s; want 1", st.ByStatus[401])
	}
}
