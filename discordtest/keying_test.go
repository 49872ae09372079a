package discordtest

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestSplitPath(t *testing.T) {
	t.Parallel()
	want := []string{"channels", "1", "messages"}
	tests := []struct {
		name string
		path string
		want []string
	}{
		{"v10", "/api/v10/channels/1/messages", want},
		{"v9", "/api/v9/channels/1/messages", want},
		{"api only", "/api/channels/1/messages", want},
		{"no prefix", "/channels/1/messages", want},
		{"trailing slash", "/api/v10/channels/1/messages/", want},
		{"root", "/", nil},
		{"not a version", "/api/vx/channels", []string{"vx", "channels"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := splitPath(tt.path); !slices.Equal(got, tt.want) {
				t.Errorf("splitPath(%q) = %q; want %q", tt.path, got, tt.want)
			}
		})
	}
}

func TestMajorParameter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name                  string
		path                  string
		major, safe, resource string
	}{
		{"channel", "/channels/1/messages", "channels/1", "channels/1", "channels/1"},
		{"guild", "/guilds/2/members/3", "guilds/2", "guilds/2", "guilds/2"},
		{"webhook", "/webhooks/4", "webhooks/4", "webhooks/4", "webhooks/4"},
		{"webhook token", "/webhooks/4/tok/messages/5", "webhooks/4/tok", "webhooks/4/" + redacted, "webhooks/4"},
		{"interaction", "/interactions/6/tok/callback", "interactions/6/tok", "interactions/6/" + redacted, "interactions/6"},
		{"user", "/users/@me", "", "", ""},
		{"too short", "/channels", "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			major, safe, resource := majorParameter(splitPath(tt.path))
			if major != tt.major || safe != tt.safe || resource != tt.resource {
				t.Errorf("majorParameter(%q) = %q, %q, %q; want %q, %q, %q",
					tt.path, major, safe, resource, tt.major, tt.safe, tt.resource)
			}
		})
	}
}

func TestExemptFromGlobal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		method string
		path   string
		want   bool
	}{
		{"interaction callback", http.MethodPost, "/interactions/1/tok/callback", true},
		{"interaction webhook", http.MethodPost, "/webhooks/2/" + interactionTokenPrefix + "xyz", true},
		{"interaction followup edit", http.MethodPatch, "/webhooks/2/" + interactionTokenPrefix + "xyz/messages/@original", true},
		{"ordinary webhook", http.MethodPost, "/webhooks/2/token", false},
		{"messages", http.MethodPost, "/channels/1/messages", false},
		{"callback by GET", http.MethodGet, "/interactions/1/tok/callback", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := exemptFromGlobal(tt.method, splitPath(tt.path)); got != tt.want {
				t.Errorf("exemptFromGlobal(%s %q) = %v; want %v", tt.method, tt.path, got, tt.want)
			}
		})
	}
}

func TestParseTemplate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		in        string
		wantShape string
		wantErr   string
	}{
		{"plain", "POST /channels/{channel_id}/messages", "POST /channels/{}/messages", ""},
		{"lower-case method", "get /users/@me", "GET /users/@me", ""},
		{"trailing slash", "PATCH /channels/{id}/", "PATCH /channels/{}", ""},
		{"no method", "/channels", "", "want"},
		{"api prefix", "GET /api/v10/users/@me", "", "without the /api prefix"},
		{"relative", "GET channels", "", "must start with /"},
		{"empty segment", "GET /channels//messages", "", "empty segment"},
		{"half placeholder", "GET /channels/{id", "", "bad placeholder"},
		{"bad method", "G3T /x", "", "bad method"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseTemplate(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parseTemplate(%q) error = %v; want one containing %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil || got.shape != tt.wantShape {
				t.Fatalf("parseTemplate(%q) = %q, %v; want %q", tt.in, got.shape, err, tt.wantShape)
			}
		})
	}
}

func TestMatchRoute(t *testing.T) {
	t.Parallel()
	_, rs, err := buildTable(
		[]Bucket{{Hash: "a", Limit: 1, Window: time.Second}, {Hash: "b", Limit: 1, Window: time.Second}},
		[]Route{
			{Template: "GET /users/{user_id}", Bucket: "a"},
			{Template: "GET /users/@me", Bucket: "b"},
			{Template: "DELETE /channels/{c}/messages/{m}", Bucket: "a"},
		})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		method string
		path   string
		want   string // hash, "" for no match
	}{
		{"literal beats placeholder", http.MethodGet, "/users/@me", "b"},
		{"placeholder", http.MethodGet, "/users/123", "a"},
		{"other method", http.MethodPost, "/users/123", ""},
		{"too long", http.MethodGet, "/users/123/guilds", ""},
		{"delete", http.MethodDelete, "/channels/1/messages/2", "a"},
		{"empty segment", http.MethodDelete, "/channels//messages/2", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ""
			if r := matchRoute(rs, tt.method, splitPath(tt.path)); r != nil {
				got = r.hash
			}
			if got != tt.want {
				t.Errorf("matchRoute(%s %q) = %q; want %q", tt.method, tt.path, got, tt.want)
			}
		})
	}
}

func TestBuildTableErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		opts    []Option
		wantErr string
	}{
		{"unknown hash", []Option{WithRoutes(Route{Template: "GET /x", Bucket: "nope"})}, "unknown bucket hash"},
		{"zero limit", []Option{WithBuckets(Bucket{Hash: "z", Window: time.Second})}, "must be positive"},
		{"zero window", []Option{WithBuckets(Bucket{Hash: "z", Limit: 1})}, "must be positive"},
		{"no hash", []Option{WithBuckets(Bucket{Limit: 1, Window: time.Second})}, "empty hash"},
		{"bad template", []Option{WithRoutes(Route{Template: "x", Bucket: hashCurrentUser})}, "route template"},
		{"bad shared", []Option{WithSharedLimit(SharedLimit{Resource: "channels/1"})}, "shared limit"},
		{"not loopback", []Option{WithAddr("0.0.0.0:0")}, "loopback"},
		{"not loopback v6", []Option{WithAddr("[::]:0")}, "loopback"},
		{"lan address", []Option{WithAddr("192.168.1.1:0")}, "loopback"},
		{"no port", []Option{WithAddr("127.0.0.1")}, "missing port"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := Start(tt.opts...)
			if err == nil {
				s.Close()
				t.Fatalf("Start succeeded; want an error containing %q", tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Start error = %v; want one containing %q", err, tt.wantErr)
			}
		})
	}
}

func TestFormats(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		d         time.Duration
		seconds   string
		retryHead string
	}{
		{"quarter", 250 * time.Millisecond, "0.250", "1"},
		{"sub-millisecond rounds up", 1234100 * time.Microsecond, "1.235", "2"},
		{"whole", 2 * time.Second, "2.000", "2"},
		{"just over", 2*time.Second + time.Nanosecond, "2.001", "3"},
		{"long", 64570 * time.Millisecond, "64.570", "65"},
		{"zero", 0, "0.000", "0"},
		{"negative", -time.Second, "0.000", "0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := formatSeconds(tt.d); got != tt.seconds {
				t.Errorf("formatSeconds(%v) = %q; want %q", tt.d, got, tt.seconds)
			}
			if got := retryAfterHeader(tt.d); got != tt.retryHead {
				t.Errorf("retryAfterHeader(%v) = %q; want %q", tt.d, got, tt.retryHead)
			}
		})
	}
	if got, want := formatEpoch(time.Unix(1700000000, 5_000_001)), "1700000000.006"; got != want {
		t.Errorf("formatEpoch = %q; want %q", got, want)
	}
	if got, want := formatEpoch(time.Unix(1700000000, 0)), "1700000000.000"; got != want {
		t.Errorf("formatEpoch = %q; want %q", got, want)
	}
}
