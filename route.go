package ratecord

import (
	"strings"
	"sync"
	"sync/atomic"
)

// The route grammar: where a Discord API path holds ids, codes and tokens.
// Keying ([parseRoute]), redaction ([RedactURL]), telemetry (the route
// descriptors) and the proxy ([PathToken], [TrimAPIPrefix]) all read paths
// through [segments], so a route Discord adds is taught here once.

// segKind is what the grammar makes of one path segment.
type segKind uint8

const (
	segWord       segKind = iota // a route word, kept as written
	segMajor                     // the id of a major parameter: channels/{id}, guilds/{id}, webhooks/{id}, interactions/{id}
	segID                        // another id: a snowflake of up to 20 digits
	segToken                     // the webhook or interaction token of webhooks/{id}/{token} or interactions/{id}/{token}
	segLong                      // another segment long enough to be a secret
	segCode                      // an invite or guild template code
	segReaction                  // a reaction's emoji
	segInReaction                // a segment after the emoji (a user): part of the reaction
)

const (
	// minSecretLen is the length from which a segment is taken for a
	// secret wherever it is: no route word is that long.
	minSecretLen = 40
	// maxIDLen is the most digits a snowflake has.
	maxIDLen = 20
	// tokenIndex is the index of the segment that holds the token in
	// webhooks/{id}/{token} and interactions/{id}/{token}.
	tokenIndex = 2
)

// segment is one segment of a path, as the grammar reads it.
type segment struct {
	text       string
	start, end int    // text is path[start:end]
	n          int    // index among the path's segments after the API prefix
	prev       string // the segment before, or ""
	kind       segKind
	literal    bool // every byte is safe in a key as it is
}

// secret reports whether the segment may hold a secret: a token, or
// anything as long as one.
func (s *segment) secret() bool {
	return s.kind == segToken || len(s.text) >= minSecretLen
}

// segments walks the segments of a path after its API prefix, empty
// segments skipped. Start one with [newSegments].
type segments struct {
	path     string
	i        int // where the next segment is looked for
	n        int // index of the next segment
	first    string
	prev     string
	id       bool // segment 1 is made of digits
	major    bool // segment 1 is the id of a major parameter
	reaction bool // a reaction's emoji was read: the rest is part of it
	legacy   bool // the API prefix names a version before 8, or none
}

// newSegments starts a walk of path after its "/api" and version prefix.
func newSegments(path string) segments {
	rest, legacy := stripAPI(path)
	return segments{path: path, i: len(path) - len(rest), legacy: legacy}
}

// next returns the next segment, or false at the end of the path.
func (w *segments) next() (segment, bool) {
	path := w.path
	for w.i < len(path) && path[w.i] == '/' {
		w.i++
	}
	if w.i >= len(path) {
		return segment{}, false
	}
	// One pass finds the segment's end and what it is made of.
	end, class := w.i, byte(classDigit|classLiteral)
	for ; end < len(path); end++ {
		k := byteClass[path[end]]
		if k&classSlash != 0 {
			break
		}
		class &= k
	}
	s := segment{text: path[w.i:end], start: w.i, end: end, n: w.n, prev: w.prev, literal: class&classLiteral != 0}
	digits := class&classDigit != 0 && len(s.text) <= maxIDLen
	switch w.n {
	case 0:
		w.first = s.text
	case 1:
		w.id = class&classDigit != 0
	}
	switch {
	case w.reaction:
		s.kind = segInReaction
	case w.n == 1 && digits && isMajorRoot(w.first):
		s.kind = segMajor
		w.major = true
	case w.n == tokenIndex && w.id && isTokenRoot(w.first):
		s.kind = segToken
	case w.prev == "reactions":
		s.kind = segReaction
		w.reaction = true
	case digits:
		s.kind = segID
	case w.prev == "invites" || w.prev == "templates" && w.first == "guilds":
		s.kind = segCode
	case len(s.text) >= minSecretLen:
		s.kind = segLong
	}
	w.prev = s.text
	w.n++
	w.i = end
	return s, true
}

// isMajorRoot reports whether an id after the route word s is a major
// parameter.
func isMajorRoot(s string) bool {
	return s == "channels" || s == "guilds" || s == "webhooks" || s == "interactions"
}

// isTokenRoot reports whether s is a route word whose routes hold a token
// after the id. Letters are compared without case, so that no spelling of
// the word lets a token through where a server that ignores case would
// see one.
func isTokenRoot(s string) bool {
	return strings.EqualFold(s, "webhooks") || strings.EqualFold(s, "interactions")
}

// stripAPI removes "/api" and "/api/vN" and reports whether the version is
// older than 8 (or absent after /api), where 429 durations are
// milliseconds. The "v" may be a capital.
func stripAPI(path string) (string, bool) {
	const api = "/api"
	if len(path) < len(api) || path[:len(api)] != api || len(path) > len(api) && path[len(api)] != '/' {
		return path, false
	}
	rest := path[len(api):]
	if len(rest) > 2 && rest[0] == '/' && (rest[1] == 'v' || rest[1] == 'V') {
		end := 2
		for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
			end++
		}
		if end > 2 && (end == len(rest) || rest[end] == '/') {
			// More than 9 digits but for leading zeros: a version far
			// above 8.
			digits := strings.TrimLeft(rest[2:end], "0")
			v, ok := parseDigits(digits)
			return rest[end:], digits == "" || ok && v < 8
		}
	}
	return rest, true
}

// TrimAPIPrefix returns the route part of a Discord API path: path without
// its leading "/api" segment and the API version segment after it ("v10",
// or "V10"), if any. "/api/v10/users/@me" gives "/users/@me", "/api/v10"
// gives "", and a path that does not start with the "/api" segment is
// returned as it is. It is safe for concurrent use.
func TrimAPIPrefix(path string) string {
	rest, _ := stripAPI(path)
	return rest
}

// PathToken reports whether a Discord API path authenticates with a token
// of its own: the webhook or interaction token of
// webhooks/{webhook.id}/{webhook.token}... or
// interactions/{interaction.id}/{interaction.token}/..., after an optional
// "/api" and version prefix, where the id is a number. If it does, the
// token is path[start:end]. The route words are matched without case, so
// that no spelling of them that a lenient server would read as a webhook
// route goes unnoticed.
//
// A request to such a path must not carry a bot's Authorization header,
// and its path must not be logged as it is. ratecord keys, logs and reports
// these requests without the token. It is safe for concurrent use.
func PathToken(path string) (start, end int, ok bool) {
	w := newSegments(path)
	for {
		seg, more := w.next()
		if !more || seg.n > tokenIndex {
			return 0, 0, false
		}
		if seg.kind == segToken {
			return seg.start, seg.end, true
		}
	}
}

// Byte classes for keying: digits, bytes kept as they are in route words
// (letters, digits, '-', '_', '@', '.'), and the path separator.
const (
	classDigit   = 1
	classLiteral = 2
	classSlash   = 4
)

// byteClass maps every byte to its classes; a constant string, so it cannot
// change.
const byteClass = "\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x02\x04\x03\x03\x03\x03\x03\x03\x03\x03\x03\x03\x00\x00\x00\x00\x00\x00\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x00\x00\x00\x00\x02\x00\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"

func literalByte(c byte) bool { return byteClass[c]&classLiteral != 0 }

// route describes a route key: what keying, telemetry and logs call it.
// Keying interns one per route key in its [templates]; it never changes.
type route struct {
	key      string // the route key: "POST /channels/:id/messages"
	method   string // "POST"
	template string // url.template: "/channels/{channel_id}/messages"
	span     string // the span name: "POST /channels/{channel_id}/messages"
	tel      routeTelemetry
}

func newRoute(key string) *route {
	method, tmpl := namedRoute(key)
	r := &route{key: key, method: method, template: tmpl, span: method + " " + tmpl}
	r.tel = newRouteTelemetry(r)
	return r
}

// templates interns route descriptors by route key, so keying a request on
// a known route allocates nothing. Readers load an immutable map; a new
// route copies it. Route keys are few (ids, tokens and codes are templated
// away), and the table stops growing at maxTemplates.
type templates struct {
	m  atomic.Pointer[map[string]*route]
	mu sync.Mutex // serializes writers
}

const maxTemplates = 4096

// get returns the descriptor of the route key b, interning it.
func (t *templates) get(b []byte) *route {
	if m := t.m.Load(); m != nil {
		if r, ok := (*m)[string(b)]; ok {
			return r
		}
	}
	r := newRoute(string(b))
	t.mu.Lock()
	defer t.mu.Unlock()
	old := t.m.Load()
	if old != nil {
		if had, ok := (*old)[r.key]; ok {
			return had
		}
		if len(*old) >= maxTemplates {
			return r
		}
	}
	m := make(map[string]*route, 1+lenOf(old))
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[r.key] = r
	t.m.Store(&m)
	return r
}

// lookup returns the descriptor of a route key that keying returned: the
// interned one, or a new one when the table was full.
func (t *templates) lookup(key string) *route {
	if m := t.m.Load(); m != nil {
		if r, ok := (*m)[key]; ok {
			return r
		}
	}
	return newRoute(key)
}

func lenOf(m *map[string]*route) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// namedRoute turns a route key ("POST /channels/:id/messages/:id#old")
// into its method and an OpenTelemetry URL template
// ("/channels/{channel_id}/messages/{message_id}").
func namedRoute(key string) (method, tmpl string) {
	key = strings.TrimSuffix(key, oldMessageSuffix)
	method, path, ok := strings.Cut(key, " ")
	if !ok {
		return "", key
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		switch s {
		case ":id":
			segs[i] = "{id}"
			if i > 0 {
				segs[i] = idName(segs[i-1])
			}
		case ":token":
			segs[i] = "{token}"
			if i > 1 {
				switch segs[i-2] {
				case "webhooks":
					segs[i] = "{webhook_token}"
				case "interactions":
					segs[i] = "{interaction_token}"
				}
			}
		case ":reaction":
			segs[i] = "{emoji}"
		case ":code":
			segs[i] = "{code}"
		}
	}
	return method, strings.Join(segs, "/")
}

// idName names the id that follows a route word.
func idName(word string) string {
	switch word {
	case "channels":
		return "{channel_id}"
	case "guilds":
		return "{guild_id}"
	case "messages":
		return "{message_id}"
	case "webhooks":
		return "{webhook_id}"
	case "interactions":
		return "{interaction_id}"
	case "users", "members":
		return "{user_id}"
	case "roles":
		return "{role_id}"
	case "emojis":
		return "{emoji_id}"
	case "applications":
		return "{application_id}"
	case "commands":
		return "{command_id}"
	}
	return "{id}"
}
