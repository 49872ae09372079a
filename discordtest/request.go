package discordtest

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// redacted replaces webhook and interaction tokens in paths and logs.
const redacted = "REDACTED"

// interactionTokenPrefix is how every interaction token starts: base64 of
// "interaction:".
const interactionTokenPrefix = "aW50ZXJhY3Rpb246"

// maxBody is the most of a request body the emulator reads.
const maxBody = 1 << 20

// request is what the emulator needs to know about one incoming request.
type request struct {
	sent      time.Time // when the client sent it: when it reached the handler, before the way to Discord
	method    string
	segs      []string // escaped path segments without the /api or /api/vN prefix
	major     string   // major parameter with tokens, "" when none
	majorSafe string   // major parameter with tokens redacted
	resource  string   // first two segments of the major parameter, "channels/1"
	exempt    bool     // exempt from the global limit
	auth      string   // Authorization header, "" when absent
	ip        string   // client IP
	process   process  // the process that sent it: ip and ProcessHeader
	cred      string   // counter key of the credential: "auth:"+auth or "ip:"+ip
	renames   bool     // PATCH /channels/{id} whose body sets name or topic
	content   string   // "content" of a JSON body
	wait      bool     // ?wait=true on a webhook execution
	// frozen marks a request frozen in flight: its process stopped after
	// handing it to the network and before it was written (see sentAt).
	// sent is then the hand-off, so it is judged by what its process knew
	// when it let it go.
	frozen bool
}

// readRequest extracts what the emulator needs from r, sent by the client at
// sent. It reads at most maxBody bytes of the body.
func readRequest(r *http.Request, sent time.Time) *request {
	q := &request{
		sent:   sent,
		method: r.Method,
		segs:   splitPath(r.URL.EscapedPath()),
		auth:   r.Header.Get("Authorization"),
		ip:     clientIP(r.RemoteAddr),
		wait:   r.URL.Query().Get("wait") == "true",
	}
	q.process = process{ip: q.ip, name: r.Header.Get(ProcessHeader)}
	q.major, q.majorSafe, q.resource = majorParameter(q.segs)
	q.exempt = exemptFromGlobal(q.method, q.segs)
	if q.auth != "" {
		q.cred = "auth:" + q.auth
	} else {
		q.cred = "ip:" + q.ip
	}
	if r.Body != nil && q.method != http.MethodGet && q.method != http.MethodHead {
		fields := readJSONFields(r.Body)
		_, name := fields["name"]
		_, topic := fields["topic"]
		q.renames = q.method == http.MethodPatch && len(q.segs) == 2 && q.segs[0] == "channels" && (name || topic)
		if raw, ok := fields["content"]; ok {
			_ = json.Unmarshal(raw, &q.content)
		}
	}
	return q
}

// readJSONFields returns the top-level fields of a JSON object body, or nil.
func readJSONFields(body io.Reader) map[string]json.RawMessage {
	data, err := io.ReadAll(io.LimitReader(body, maxBody))
	if err != nil || len(data) == 0 {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) != nil {
		return nil
	}
	return fields
}

// clientIP returns the host part of a remote address.
func clientIP(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		return remote
	}
	return host
}

// splitPath splits an escaped path into segments, dropping a leading /api or
// /api/vN. The query string is not part of the path.
func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	segs := strings.Split(p, "/")
	if segs[0] == "api" {
		segs = segs[1:]
		if len(segs) > 0 && isVersion(segs[0]) {
			segs = segs[1:]
		}
	}
	return segs
}

// isVersion reports whether s looks like "v10".
func isVersion(s string) bool {
	if len(s) < 2 || s[0] != 'v' {
		return false
	}
	for _, r := range s[1:] {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// majorParameter returns the major parameter of a path: channels/{id},
// guilds/{id}, webhooks/{id} or webhooks/{id}/{token}, and
// interactions/{id}/{token}; the same with the token redacted; and the
// resource, the first two segments.
func majorParameter(segs []string) (major, safe, resource string) {
	if len(segs) < 2 || segs[1] == "" {
		return "", "", ""
	}
	resource = segs[0] + "/" + segs[1]
	switch segs[0] {
	case "channels", "guilds":
		return resource, resource, resource
	case "webhooks", "interactions":
		if len(segs) >= 3 && segs[2] != "" {
			return resource + "/" + segs[2], resource + "/" + redacted, resource
		}
		return resource, resource, resource
	}
	return "", "", ""
}

// exemptFromGlobal reports whether a request is exempt from the global limit:
// interaction callbacks and interaction webhooks.
func exemptFromGlobal(method string, segs []string) bool {
	if method == http.MethodPost && len(segs) == 4 && segs[0] == "interactions" && segs[3] == "callback" {
		return true
	}
	return len(segs) >= 3 && segs[0] == "webhooks" && strings.HasPrefix(segs[2], interactionTokenPrefix)
}

// safePath returns the request's method and path with webhook and
// interaction tokens redacted, for routes that match no template.
func (q *request) safePath() string {
	segs := q.segs
	if len(segs) >= 3 && (segs[0] == "webhooks" || segs[0] == "interactions") {
		segs = append([]string(nil), segs...)
		segs[2] = redacted
	}
	return q.method + " /" + strings.Join(segs, "/")
}
