package discordtest

import (
	"fmt"
	"strings"
	"time"
)

// Bucket is one row of the emulator's bucket table: the limit shared by every
// route mapped to Hash. Counters are kept per credential, bucket hash and major
// parameter, so two channels never share a counter even when their routes share
// a hash.
//
// The zero value is not a valid bucket: Hash must be set and Limit and Window
// must be positive.
type Bucket struct {
	// Hash is the opaque value sent in X-RateLimit-Bucket.
	Hash string
	// Limit is the number of requests the bucket really allows per Window.
	Limit int
	// Window is the length of the window before the time scale is applied.
	Window time.Duration
	// Fixed selects a fixed window: it opens at the first request, counts up
	// to Limit and empties all at once when Window has passed. The zero value
	// selects a sliding window: a leaky bucket of capacity Limit that drains
	// continuously at Limit per Window, so slots come back one at a time.
	Fixed bool
	// Announced, when positive, is the value sent in X-RateLimit-Limit
	// instead of Limit, to emulate headers that misstate the real limit.
	// When it is below Limit, the headers understate it:
	// X-RateLimit-Remaining is capped at Announced. When it is above, they
	// overstate it, as Discord's ban route does: X-RateLimit-Remaining
	// counts down from Announced (Announced less the requests the window
	// holds), while Limit per Window is still enforced, with 429s of scope
	// user whose X-RateLimit-Remaining is 0 and whose retry_after is the real
	// wait.
	Announced int
	// Claim, when its Limit is positive, fixes the X-RateLimit-Limit,
	// -Remaining and -Reset-After every response of the bucket carries,
	// 429s included, whatever its counters hold, to emulate headers that
	// claim more room than the bucket has (or other room than it has), as
	// Discord's reaction and ban-list routes do. Limit per Window is still
	// enforced, with 429s of scope user whose retry_after is the real wait.
	// Claim takes precedence over Announced.
	Claim Claim
}

// Claim is what a bucket's rate-limit headers say regardless of its real
// state; see [Bucket].Claim. The zero Claim claims nothing.
type Claim struct {
	// Limit is sent as X-RateLimit-Limit.
	Limit int
	// Remaining is sent as X-RateLimit-Remaining; at most Limit.
	Remaining int
	// ResetAfter is sent as X-RateLimit-Reset-After, and X-RateLimit-Reset
	// is that far in the future, after the time scale.
	ResetAfter time.Duration
}

// overstates reports whether the bucket's headers announce a higher limit
// than it has, and no claim overrides them.
func (b Bucket) overstates() bool { return !b.Claim.claims() && b.Announced > b.Limit }

// claims reports whether the claim is set.
func (c Claim) claims() bool { return c.Limit > 0 }

// Route maps a route template to a bucket hash.
//
// Template is a method and a path written without the /api or /api/vN prefix,
// such as "POST /channels/{channel_id}/messages". A segment in braces matches
// any one non-empty path segment; every other segment must match exactly.
// When several templates match a request, the one with the most literal
// segments wins, then the one listed first.
type Route struct {
	Template string
	Bucket   string
}

// Hashes of the default bucket table. They are opaque, like Discord's.
const (
	hashMessageCreate = "a06de2c5e7a4cb1b79e6d2fa3e3d1b4c"
	hashMessageList   = "5fc7a4f0c8b6d3e2a1f9e8d7c6b5a493"
	hashChannelModify = "c1d2e3f4a5b6c7d8e9f0a1b2c3d4e5f6"
	hashMessageDelete = "7b6f5e4d3c2b1a09f8e7d6c5b4a39281"
	hashReaction      = "0b8a7c6d5e4f3a2b1c0d9e8f7a6b5c4d"
	hashMemberModify  = "e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4"
	hashWebhookExec   = "3f2e1d0c9b8a7f6e5d4c3b2a1f0e9d8c"
	hashInteraction   = "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4e"
	hashCurrentUser   = "4d3c2b1a0f9e8d7c6b5a4f3e2d1c0b9a"
)

// DefaultBuckets returns a new copy of the emulator's default bucket table.
// Every call returns a fresh slice that the caller may modify.
func DefaultBuckets() []Bucket {
	return []Bucket{
		{Hash: hashMessageCreate, Limit: 5, Window: 5 * time.Second},
		{Hash: hashMessageList, Limit: 5, Window: 5 * time.Second},
		{Hash: hashChannelModify, Limit: 5, Window: 5 * time.Second},
		{Hash: hashMessageDelete, Limit: 5, Window: time.Second},
		{Hash: hashReaction, Limit: 1, Window: 250 * time.Millisecond},
		{Hash: hashMemberModify, Limit: 10, Window: 10 * time.Second, Fixed: true},
		{Hash: hashWebhookExec, Limit: 5, Window: 2 * time.Second},
		{Hash: hashInteraction, Limit: 5, Window: time.Second},
		{Hash: hashCurrentUser, Limit: 5, Window: time.Second},
	}
}

// DefaultRoutes returns a new copy of the emulator's default route table,
// whose hashes all appear in [DefaultBuckets]. Every call returns a fresh
// slice that the caller may modify.
func DefaultRoutes() []Route {
	return []Route{
		{Template: "POST /channels/{channel_id}/messages", Bucket: hashMessageCreate},
		{Template: "GET /channels/{channel_id}/messages", Bucket: hashMessageList},
		{Template: "PATCH /channels/{channel_id}", Bucket: hashChannelModify},
		{Template: "DELETE /channels/{channel_id}/messages/{message_id}", Bucket: hashMessageDelete},
		{Template: "PUT /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", Bucket: hashReaction},
		{Template: "DELETE /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", Bucket: hashReaction},
		{Template: "DELETE /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/{user_id}", Bucket: hashReaction},
		{Template: "PATCH /guilds/{guild_id}/members/{user_id}", Bucket: hashMemberModify},
		{Template: "PUT /guilds/{guild_id}/members/{user_id}/roles/{role_id}", Bucket: hashMemberModify},
		{Template: "DELETE /guilds/{guild_id}/members/{user_id}/roles/{role_id}", Bucket: hashMemberModify},
		{Template: "POST /webhooks/{webhook_id}/{webhook_token}", Bucket: hashWebhookExec},
		{Template: "POST /interactions/{interaction_id}/{interaction_token}/callback", Bucket: hashInteraction},
		{Template: "GET /users/@me", Bucket: hashCurrentUser},
	}
}

// segment is one parsed segment of a route template.
type segment struct {
	literal string // the exact text to match, empty for a placeholder
	wild    bool   // true for a {placeholder}
}

// template is a parsed route template.
type template struct {
	text     string // as written, normalised: "METHOD /a/{b}"
	shape    string // placeholders erased, "METHOD /a/{}": two templates with one shape are the same route
	method   string
	segs     []segment
	literals int
}

// parseTemplate parses a template such as "POST /channels/{channel_id}/messages".
func parseTemplate(s string) (template, error) {
	method, path, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok || method == "" {
		return template{}, fmt.Errorf("route template %q: want \"METHOD /path\"", s)
	}
	for _, r := range method {
		if (r < 'A' || r > 'Z') && (r < 'a' || r > 'z') {
			return template{}, fmt.Errorf("route template %q: bad method", s)
		}
	}
	method = strings.ToUpper(method)
	path = strings.TrimSpace(path)
	if !strings.HasPrefix(path, "/") {
		return template{}, fmt.Errorf("route template %q: path must start with /", s)
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	if parts[0] == "api" {
		return template{}, fmt.Errorf("route template %q: write it without the /api prefix", s)
	}
	t := template{method: method}
	shape := make([]string, len(parts))
	for i, p := range parts {
		switch {
		case p == "":
			return template{}, fmt.Errorf("route template %q: empty segment", s)
		case strings.HasPrefix(p, "{") && strings.HasSuffix(p, "}") && len(p) > 2:
			t.segs = append(t.segs, segment{wild: true})
			shape[i] = "{}"
		case strings.ContainsAny(p, "{}"):
			return template{}, fmt.Errorf("route template %q: bad placeholder %q", s, p)
		default:
			t.segs = append(t.segs, segment{literal: p})
			t.literals++
			shape[i] = p
		}
	}
	t.text = method + " /" + strings.Join(parts, "/")
	t.shape = method + " /" + strings.Join(shape, "/")
	return t, nil
}

// match reports whether the template matches a request's method and path
// segments (prefix already stripped).
func (t *template) match(method string, segs []string) bool {
	if method != t.method || len(segs) != len(t.segs) {
		return false
	}
	for i, s := range t.segs {
		if s.wild {
			if segs[i] == "" {
				return false
			}
			continue
		}
		if s.literal != segs[i] {
			return false
		}
	}
	return true
}

// route is a parsed row of the route table.
type route struct {
	tmpl template
	hash string
}

// validateBucket checks that a bucket can be used.
func validateBucket(b Bucket) error {
	switch {
	case b.Hash == "":
		return fmt.Errorf("bucket with an empty hash")
	case b.Limit <= 0:
		return fmt.Errorf("bucket %q: limit %d must be positive", b.Hash, b.Limit)
	case b.Window <= 0:
		return fmt.Errorf("bucket %q: window %v must be positive", b.Hash, b.Window)
	case b.Announced < 0:
		return fmt.Errorf("bucket %q: announced limit %d is negative", b.Hash, b.Announced)
	case b.Claim.Limit < 0 || (b.Claim.claims() && (b.Claim.Remaining < 0 || b.Claim.Remaining > b.Claim.Limit || b.Claim.ResetAfter < 0)):
		return fmt.Errorf("bucket %q: claim %+v: want remaining within 0..limit and a reset not negative", b.Hash, b.Claim)
	}
	return nil
}

// buildTable turns bucket and route rows into the server's tables. Later rows
// replace earlier ones with the same hash or the same route shape.
func buildTable(buckets []Bucket, routes []Route) (map[string]Bucket, []route, error) {
	bm := make(map[string]Bucket, len(buckets))
	for _, b := range buckets {
		if err := validateBucket(b); err != nil {
			return nil, nil, err
		}
		bm[b.Hash] = b
	}
	var rs []route
	for _, r := range routes {
		t, err := parseTemplate(r.Template)
		if err != nil {
			return nil, nil, err
		}
		if _, ok := bm[r.Bucket]; !ok {
			return nil, nil, fmt.Errorf("route %q: unknown bucket hash %q", r.Template, r.Bucket)
		}
		rs = setRoute(rs, route{tmpl: t, hash: r.Bucket})
	}
	return bm, rs, nil
}

// setRoute replaces the route with the same shape as r, or appends r.
func setRoute(rs []route, r route) []route {
	for i := range rs {
		if rs[i].tmpl.shape == r.tmpl.shape {
			rs[i] = r
			return rs
		}
	}
	return append(rs, r)
}

// matchRoute returns the best route for a request, or nil.
func matchRoute(rs []route, method string, segs []string) *route {
	var best *route
	for i := range rs {
		r := &rs[i]
		if !r.tmpl.match(method, segs) {
			continue
		}
		if best == nil || r.tmpl.literals > best.tmpl.literals {
			best = r
		}
	}
	return best
}
