package ratecord

import (
	"testing"
	"time"
)

func TestNamedRoute(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, route, method, tmpl string
	}{
		{"messages", "POST /channels/:id/messages", "POST", "/channels/{channel_id}/messages"},
		{"message", "PATCH /channels/:id/messages/:id", "PATCH", "/channels/{channel_id}/messages/{message_id}"},
		{"old message", "DELETE /channels/:id/messages/:id#old", "DELETE", "/channels/{channel_id}/messages/{message_id}"},
		{"reaction", "PUT /channels/:id/messages/:id/reactions/:reaction", "PUT", "/channels/{channel_id}/messages/{message_id}/reactions/{emoji}"},
		{"member", "GET /guilds/:id/members/:id", "GET", "/guilds/{guild_id}/members/{user_id}"},
		{"member role", "PUT /guilds/:id/members/:id/roles/:id", "PUT", "/guilds/{guild_id}/members/{user_id}/roles/{role_id}"},
		{"emoji", "DELETE /guilds/:id/emojis/:id", "DELETE", "/guilds/{guild_id}/emojis/{emoji_id}"},
		{"user", "GET /users/:id", "GET", "/users/{user_id}"},
		{"me", "GET /users/@me", "GET", "/users/@me"},
		{"command", "PATCH /applications/:id/guilds/:id/commands/:id", "PATCH", "/applications/{application_id}/guilds/{guild_id}/commands/{command_id}"},
		{"webhook", "POST /webhooks/:id/:token", "POST", "/webhooks/{webhook_id}/{webhook_token}"},
		{"webhook message", "PATCH /webhooks/:id/:token/messages/@original", "PATCH", "/webhooks/{webhook_id}/{webhook_token}/messages/@original"},
		{"interaction", "POST /interactions/:id/:token/callback", "POST", "/interactions/{interaction_id}/{interaction_token}/callback"},
		{"invite", "GET /invites/:code", "GET", "/invites/{code}"},
		{"template", "GET /guilds/templates/:code", "GET", "/guilds/templates/{code}"},
		{"unknown word", "PUT /channels/:id/permissions/:id", "PUT", "/channels/{channel_id}/permissions/{id}"},
		{"long segment", "GET /things/:token", "GET", "/things/{token}"},
		{"root", "GET /", "GET", "/"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			method, tmpl := namedRoute(tc.route)
			if method != tc.method || tmpl != tc.tmpl {
				t.Errorf("namedRoute(%q) = %q, %q; want %q, %q", tc.route, method, tmpl, tc.method, tc.tmpl)
			}
		})
	}
}

// TestNamedRouteOfKeyedPaths checks that every template keying produces
// has no placeholder left in the ":name" form.
func TestNamedRouteOfKeyedPaths(t *testing.T) {
	t.Parallel()
	now := func() time.Time { return time.Unix(1700000000, 0) }
	for _, path := range []string{
		"/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me",
		"/api/v10/webhooks/1/abc/messages/2",
		"/api/v10/interactions/1/aW50ZXJhY3Rpb246xyz/callback",
		"/api/v10/guilds/1/templates/abc",
		"/api/v10/invites/abc",
		"/api/v10/channels/1/messages/2",
		"/api/v10/stickers/1",
	} {
		rk := parseRoute("DELETE", path, now, nil)
		_, tmpl := namedRoute(rk.route)
		for i := 0; i+1 < len(tmpl); i++ {
			if tmpl[i] == '/' && tmpl[i+1] == ':' {
				t.Errorf("namedRoute(%q) = %q; want named placeholders only", rk.route, tmpl)
			}
		}
	}
}
