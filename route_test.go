package ratecord_test

import (
	"fmt"
	"net/url"
	"testing"

	"github.com/ratecord/ratecord"
)

func TestPathToken(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, path, token string // token "" means none
	}{
		{"webhook", "/api/v10/webhooks/1/tok", "tok"},
		{"webhook message", "/api/v10/webhooks/1/tok/messages/2", "tok"},
		{"no version", "/api/webhooks/1/tok", "tok"},
		{"no prefix", "/webhooks/1/tok", "tok"},
		{"interaction", "/api/v10/interactions/1/tok/callback", "tok"},
		{"capitals", "/api/V9/INTERACTIONS/1/tok/callback", "tok"},
		{"double slashes", "/api/v10//webhooks//1//tok", "tok"},
		{"webhook by id", "/api/v10/webhooks/1", ""},
		{"trailing slash", "/api/v10/webhooks/1/", ""},
		{"id not a number", "/api/v10/webhooks/:id/:token", ""},
		{"channel webhooks", "/api/v10/channels/1/webhooks", ""},
		{"not a version", "/api/v10/vx/webhooks/1/tok", ""},
		{"long segment elsewhere", "/api/v10/oauth2/0123456789012345678901234567890123456789", ""},
		{"empty", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start, end, ok := ratecord.PathToken(tt.path)
			got := ""
			if ok {
				got = tt.path[start:end]
			}
			if ok != (tt.token != "") || got != tt.token {
				t.Errorf("PathToken(%q) = %d, %d, %v (%q); want %q", tt.path, start, end, ok, got, tt.token)
			}
		})
	}
}

func TestTrimAPIPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct{ path, want string }{
		{"/api/v10/users/@me", "/users/@me"},
		{"/api/V9/users/@me", "/users/@me"},
		{"/api/users/@me", "/users/@me"},
		{"/api/v10", ""},
		{"/api/v10x/y", "/v10x/y"},
		{"/api", ""},
		{"/apix/y", "/apix/y"},
		{"/users/@me", "/users/@me"},
	}
	for _, tt := range tests {
		if got := ratecord.TrimAPIPrefix(tt.path); got != tt.want {
			t.Errorf("TrimAPIPrefix(%q) = %q; want %q", tt.path, got, tt.want)
		}
	}
}

func TestRedactURLQueryAndPrefix(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"https://discord.com/api/v10/channels/1/messages?limit=50&before=123&wait=true",
			"https://discord.com/api/v10/channels/1/messages?limit=50&before=123&wait=true"},
		{"https://discord.com/api/v10/oauth2/authorize?code=abc&state=xyz&flag",
			"https://discord.com/api/v10/oauth2/authorize?code=REDACTED&state=REDACTED&flag"},
		{"https://discord.com/api/v10/users/@me?token%3Dabc=1", "https://discord.com/api/v10/users/@me?REDACTED"},
		{"https://discord.com/api/v10/users/@me?", "https://discord.com/api/v10/users/@me?"},
		{"http://proxy.test/discord/api/v10/webhooks/1/shorttoken/messages/2",
			"http://proxy.test/discord/api/v10/webhooks/1/REDACTED/messages/2"},
		{"https://discord.com/api/v10/Webhooks/1/shorttoken", "https://discord.com/api/v10/Webhooks/1/REDACTED"},
		{"https://discord.com/api/v10/channels/1/messages/2/reactions/name:1234567890123456789012345678901234567/@me",
			"https://discord.com/api/v10/channels/1/messages/2/reactions/REDACTED/@me"},
	}
	for _, tt := range tests {
		u, err := url.Parse(tt.in)
		if err != nil {
			t.Fatal(err)
		}
		if got := ratecord.RedactURL(u); got != tt.want {
			t.Errorf("RedactURL(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// A proxy that adds a bot's token to requests must leave out the requests
// that authenticate with a token in their path, and must not log that
// token.
func ExamplePathToken() {
	for _, path := range []string{
		"/api/v10/channels/123/messages",
		"/api/v10/webhooks/123/my-webhook-token/messages/@original",
	} {
		start, end, ok := ratecord.PathToken(path)
		if !ok {
			fmt.Println("bot token:", path)
			continue
		}
		fmt.Println("own token:", path[:start]+"REDACTED"+path[end:])
	}
	// Output:
	// bot token: /api/v10/channels/123/messages
	// own token: /api/v10/webhooks/123/REDACTED/messages/@original
}
