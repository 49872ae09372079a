package ratecord

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// snowflakeAt returns a snowflake created at t.
func snowflakeAt(t time.Time) string {
	return itoa(uint64(t.UnixMilli()-discordEpoch) << 22)
}

func itoa(v uint64) string {
	if v == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for v > 0 {
		i--
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[i:])
}

const (
	webhookToken     = "hA6cXzTUsyIEPl2rsoVnrm5bUgXvYbMzumVqpIsTGwQtb0ZD1Ow5IS8Q2-UEUyR8Y0Tp"
	interactionToken = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDEyMzQ1Njc4OTpzZWNyZXRzZWNyZXRzZWNyZXRzZWNyZXQ"
)

func TestParseRoute(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	recent := snowflakeAt(now.Add(-time.Hour))
	old := snowflakeAt(now.Add(-15 * 24 * time.Hour))
	tests := []struct {
		name, method, path string
		route, major       string
		global, tokenAuth  bool
		legacy             bool
	}{
		{"message create", "POST", "/api/v10/channels/123456789012345678/messages",
			"POST /channels/:id/messages", "channels/123456789012345678", true, false, false},
		{"no api prefix", "POST", "/channels/1/messages", "POST /channels/:id/messages", "channels/1", true, false, false},
		{"api without version is legacy", "GET", "/api/channels/1", "GET /channels/:id", "channels/1", true, false, true},
		{"v7 is legacy", "GET", "/api/v7/channels/1", "GET /channels/:id", "channels/1", true, false, true},
		{"v9", "GET", "/api/v9/guilds/42/members/7", "GET /guilds/:id/members/:id", "guilds/42", true, false, false},
		{"method is part of the route", "PATCH", "/api/v10/channels/1", "PATCH /channels/:id", "channels/1", true, false, false},
		{"no major", "GET", "/api/v10/users/@me", "GET /users/@me", "", true, false, false},
		{"other snowflakes", "GET", "/api/v10/users/80351110224678912", "GET /users/:id", "", true, false, false},
		{"reactions collapse", "PUT", "/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me",
			"PUT /channels/:id/messages/:id/reactions/:reaction", "channels/1", true, false, false},
		{"reactions collapse, custom emoji and user", "DELETE", "/api/v10/channels/1/messages/2/reactions/name:123/456",
			"DELETE /channels/:id/messages/:id/reactions/:reaction", "channels/1", true, false, false},
		{"recent message delete", "DELETE", "/api/v10/channels/1/messages/" + recent,
			"DELETE /channels/:id/messages/:id", "channels/1", true, false, false},
		{"old message delete has its own route", "DELETE", "/api/v10/channels/1/messages/" + old,
			"DELETE /channels/:id/messages/:id" + oldMessageSuffix, "channels/1", true, false, false},
		{"old message get is not special", "GET", "/api/v10/channels/1/messages/" + old,
			"GET /channels/:id/messages/:id", "channels/1", true, false, false},
		{"webhook by id", "GET", "/api/v10/webhooks/99", "GET /webhooks/:id", "webhooks/99", true, false, false},
		{"webhook with token", "POST", "/api/v10/webhooks/99/" + webhookToken,
			"POST /webhooks/:id/:token", "webhooks/99/" + webhookToken, true, true, false},
		{"webhook message", "PATCH", "/api/v10/webhooks/99/" + webhookToken + "/messages/5",
			"PATCH /webhooks/:id/:token/messages/:id", "webhooks/99/" + webhookToken, true, true, false},
		{"interaction webhook is exempt", "POST", "/api/v10/webhooks/99/" + interactionToken,
			"POST /webhooks/:id/:token", "webhooks/99/" + interactionToken, false, true, false},
		{"interaction callback is exempt", "POST", "/api/v10/interactions/77/" + interactionToken + "/callback",
			"POST /interactions/:id/:token/callback", "interactions/77", false, true, false},
		{"query is ignored", "GET", "/api/v10/channels/1/messages", "GET /channels/:id/messages", "channels/1", true, false, false},
		{"invite codes", "GET", "/api/v10/invites/discord-developers", "GET /invites/:code", "", true, false, false},
		{"guild templates", "GET", "/api/v10/guilds/templates/hgM48av5Q69A", "GET /guilds/templates/:code", "", true, false, false},
		{"long unknown segments are not kept", "GET", "/api/v10/oauth2/" + strings.Repeat("x", 50), "GET /oauth2/:token", "", true, false, false},
		{"odd bytes are replaced", "GET", "/api/v10/users/a b\x00", "GET /users/a_b_", "", true, false, false},
		{"root", "GET", "/", "GET /", "", true, false, false},
		{"double slashes", "GET", "//api/v10//channels//1", "GET /api/v10/channels/:id", "", true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseRoute(tt.method, tt.path, func() time.Time { return now }, nil)
			if got.route != tt.route || got.major != tt.major || got.global != tt.global || got.tokenAuth != tt.tokenAuth || got.legacy != tt.legacy {
				t.Errorf("parseRoute(%q, %q) = {route %q major %q global %v tokenAuth %v legacy %v}; want {%q %q %v %v %v}",
					tt.method, tt.path, got.route, got.major, got.global, got.tokenAuth, got.legacy,
					tt.route, tt.major, tt.global, tt.tokenAuth, tt.legacy)
			}
		})
	}
}

func TestKeyHidesSecrets(t *testing.T) {
	t.Parallel()
	k := newKeyer([]byte("k"))
	now := time.Now
	for _, path := range []string{
		"/api/v10/webhooks/99/" + webhookToken,
		"/api/v10/webhooks/99/" + interactionToken + "/messages/@original",
		"/api/v10/interactions/77/" + interactionToken + "/callback",
	} {
		req, _ := http.NewRequest("POST", "https://discord.com"+path, nil)
		req.Header.Set("Authorization", "Bot "+webhookToken)
		got := k.key(req, now)
		for _, s := range []string{got.credential, got.route, got.major} {
			if leaks(s, webhookToken) || leaks(s, interactionToken) {
				t.Errorf("key(%q) = %+v; leaks a token", path, got)
			}
		}
		if !got.tokenAuth {
			t.Errorf("key(%q).tokenAuth = false", path)
		}
	}
}

// leaks reports whether s contains a piece of secret longer than 8 bytes.
func leaks(s, secret string) bool {
	for i := 0; i+9 <= len(secret); i++ {
		if strings.Contains(s, secret[i:i+9]) {
			return true
		}
	}
	return false
}

func TestCredential(t *testing.T) {
	t.Parallel()
	a, b := newKeyer([]byte("one")), newKeyer([]byte("one"))
	other := newKeyer([]byte("two"))
	req := func(auth string) *http.Request {
		r, _ := http.NewRequest("GET", "https://discord.com/api/v10/users/@me", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		return r
	}
	now := time.Now
	x := a.key(req("Bot token-x"), now).credential
	if x2 := b.key(req("Bot token-x"), now).credential; x != x2 {
		t.Errorf("same key, same token: %q != %q; processes sharing a store must agree", x, x2)
	}
	if y := a.key(req("Bot token-y"), now).credential; y == x {
		t.Errorf("different tokens share credential %q", x)
	}
	if z := other.key(req("Bot token-x"), now).credential; z == x {
		t.Errorf("different hash keys give the same credential %q", x)
	}
	if u := a.key(req(""), now).credential; u != store.Unauthenticated {
		t.Errorf("no Authorization: credential %q; want %q", u, store.Unauthenticated)
	}
	if strings.Contains(x, "token") {
		t.Errorf("credential %q contains the token", x)
	}
	// Many tokens keep the cache bounded.
	for i := 0; i < 2*maxCachedSecrets; i++ {
		a.key(req("Bot "+itoa(uint64(i))), now)
	}
	a.mu.RLock()
	n := len(a.cache)
	a.mu.RUnlock()
	if n > maxCachedSecrets {
		t.Errorf("cache holds %d secrets; want at most %d", n, maxCachedSecrets)
	}
}

func FuzzParseRoute(f *testing.F) {
	for _, s := range []string{
		"/api/v10/channels/1/messages", "/api/v6/webhooks/1/tok", "/interactions/1/2/callback",
		"/api/v10/channels/1/messages/2/reactions/x/@me", "", "/", "/api/v", "/api/v99999999999999999999/x",
	} {
		f.Add("GET", s)
	}
	now := time.Now
	f.Fuzz(func(t *testing.T, method, path string) {
		var tmpl templates
		rk := parseRoute(method, path, now, &tmpl)
		if !strings.HasPrefix(rk.route, method+" /") {
			t.Fatalf("parseRoute(%q, %q).route = %q; want the method and a path", method, path, rk.route)
		}
		for _, seg := range strings.Split(rk.route[len(method)+1:], "/") {
			if len(seg) >= 40 && !strings.HasPrefix(seg, ":") {
				t.Fatalf("parseRoute(%q, %q).route = %q keeps a long segment", method, path, rk.route)
			}
		}
		if rk.major != "" && !strings.Contains(path, rk.major) {
			t.Fatalf("parseRoute(%q, %q).major = %q is not from the path", method, path, rk.major)
		}
		// Keying is a function of the request alone.
		if again := parseRoute(method, path, now, nil); again != rk {
			t.Fatalf("parseRoute(%q, %q) not deterministic: %+v then %+v", method, path, rk, again)
		}
	})
}

func BenchmarkKey(b *testing.B) {
	k := newKeyer([]byte(defaultHashKey))
	req, _ := http.NewRequest("POST", "https://discord.com/api/v10/channels/123456789012345678/messages", nil)
	req.Header.Set("Authorization", "Bot "+webhookToken)
	now := time.Now
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_ = k.key(req, now)
	}
}

func TestPathCache(t *testing.T) {
	t.Parallel()
	k := newKeyer([]byte("k"))
	now := time.Now
	for i := 0; i < 3*pathCacheSize; i++ {
		for _, method := range []string{"GET", "POST", ""} {
			path := "/api/v10/channels/" + itoa(uint64(i)) + "/messages"
			req, _ := http.NewRequest(method, "https://discord.com"+path, nil)
			if method == "" {
				req.Method = ""
				method = "GET"
			}
			for range 2 { // a miss, then (usually) a hit
				got := k.key(req, now)
				want := parseRoute(method, path, now, nil)
				want.credential = store.Unauthenticated
				if got != want {
					t.Fatalf("key(%s %s) = %+v; want %+v", method, path, got, want)
				}
			}
		}
	}
	// Paths with tokens stay out of the cache.
	req, _ := http.NewRequest("POST", "https://discord.com/api/v10/webhooks/1/"+webhookToken, nil)
	k.key(req, now)
	for i := range k.paths {
		if e := k.paths[i].Load(); e != nil && strings.Contains(e.path, webhookToken) {
			t.Fatalf("the path cache holds a token: %q", e.path)
		}
	}
}

// BenchmarkKeyMiss keys a new path every time: the parse without the path
// cache.
func BenchmarkKeyMiss(b *testing.B) {
	k := newKeyer([]byte(defaultHashKey))
	reqs := make([]*http.Request, 1<<14)
	for i := range reqs {
		reqs[i], _ = http.NewRequest("POST", "https://discord.com/api/v10/channels/"+itoa(uint64(1<<50+i*7919))+"/messages", nil)
		reqs[i].Header.Set("Authorization", "Bot "+webhookToken)
	}
	now := time.Now
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k.paths[i%pathCacheSize].Store(nil)
		_ = k.key(reqs[i%len(reqs)], now)
	}
}
