package main

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestCheckTarget(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, uri string
		want      string // the decoded path
		err       error  // nil: accepted
		api       bool   // isAPIPath of the accepted path
	}{
		// Legitimate paths.
		{"message", "/api/v10/channels/123/messages", "/api/v10/channels/123/messages", nil, true},
		{"query kept out of the path", "/api/v10/channels/123/messages?wait=true&x=%2F", "/api/v10/channels/123/messages", nil, true},
		{"webhook token", "/api/v10/webhooks/1/" + webhookToken, "/api/v10/webhooks/1/" + webhookToken, nil, true},
		{"webhook message", "/api/v10/webhooks/1/" + webhookToken + "/messages/@original", "/api/v10/webhooks/1/" + webhookToken + "/messages/@original", nil, true},
		{"interaction callback", "/api/v10/interactions/2/" + webhookToken + "/callback", "/api/v10/interactions/2/" + webhookToken + "/callback", nil, true},
		{"unversioned", "/api/users/@me", "/api/users/@me", nil, true},
		{"emoji reaction", "/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me", "/api/v10/channels/1/messages/2/reactions/\U0001F44D/@me", nil, true},
		{"emoji reaction, raw bytes", "/api/v10/channels/1/messages/2/reactions/\U0001F44D/@me", "/api/v10/channels/1/messages/2/reactions/\U0001F44D/@me", nil, true},
		{"emoji with variation selector", "/api/v10/channels/1/messages/2/reactions/%E2%9D%A4%EF%B8%8F", "/api/v10/channels/1/messages/2/reactions/\u2764\ufe0f", nil, true},
		{"custom emoji", "/api/v10/channels/1/messages/2/reactions/blob%3A123/@me", "/api/v10/channels/1/messages/2/reactions/blob:123/@me", nil, true},
		{"encoded letter", "/api/v10/%63hannels/1", "/api/v10/channels/1", nil, true},
		{"trailing slash", "/api/v10/channels/1/", "/api/v10/channels/1/", nil, true},
		{"dots inside a segment", "/api/v10/guilds/1/a..b", "/api/v10/guilds/1/a..b", nil, true},
		{"health", "/healthz", "/healthz", nil, false},
		{"metrics", "/metrics", "/metrics", nil, false},
		{"elsewhere", "/elsewhere", "/elsewhere", nil, false},
		{"api alone", "/api", "/api", nil, false},
		{"api slash", "/api/", "/api/", nil, false},
		{"version alone", "/api/v10", "/api/v10", nil, false},
		{"version slash", "/api/v10/", "/api/v10/", nil, false},
		{"api prefix", "/apix/users/@me", "/apix/users/@me", nil, false},

		// Dot-segments in every spelling.
		{"dot-dot", "/api/v10/../../admin", "", errDotSegment, false},
		{"dot-dot after api", "/api/../oauth2/authorize", "", errDotSegment, false},
		{"dot", "/api/v10/./users/@me", "", errDotSegment, false},
		{"trailing dot-dot", "/api/v10/channels/..", "", errDotSegment, false},
		{"webhook behind dot-dot", "/api/v10/channels/1/../../webhooks/1/" + webhookToken, "", errDotSegment, false},
		{"unversioned webhook behind dot-dot", "/channels/1/../../webhooks/1/" + webhookToken, "", errDotSegment, false},
		{"encoded dot-dot", "/api/v10/%2e%2e/%2e%2e/admin", "", errDotSegment, false},
		{"encoded dot-dot, capitals", "/api/v10/%2E%2E/admin", "", errDotSegment, false},
		{"half encoded", "/api/v10/.%2e/admin", "", errDotSegment, false},
		{"encoded dot", "/api/v10/%2e/users/@me", "", errDotSegment, false},
		{"three dots", "/api/v10/.../admin", "", errDotSegment, false},
		{"dot-dot encoded slash", "/api/v10/..%2f..%2fadmin", "", errEncodedSlash, false},
		{"dot-dot encoded slash, capital", "/api/v10/..%2F..%2Fadmin", "", errEncodedSlash, false},
		{"double-encoded dot-dot", "/api/v10/%252e%252e/admin", "", errDoubleEncoded, false},
		{"double-encoded slash", "/api/v10/..%252f..%252fadmin", "", errDoubleEncoded, false},
		{"dot-dot with parameter", "/api/v10/..;/admin", "", errBadByte, false},
		{"backslashes", `/api/v10/channels/1/..\..\webhooks/1/x`, "", errBadByte, false},
		{"encoded backslashes", "/api/v10/channels/1/..%5c..%5cadmin", "", errBadByte, false},
		{"fullwidth dots", "/api/v10/channels/1/messages/2/reactions/%EF%BC%8E%EF%BC%8E/x", "", errConfusable, false},
		{"fullwidth dots outside reactions", "/api/v10/%EF%BC%8E%EF%BC%8E/admin", "", errNonASCII, false},
		{"two dot leader", "/api/v10/channels/1/messages/2/reactions/%E2%80%A5", "", errConfusable, false},
		{"overlong dot", "/api/v10/channels/1/messages/2/reactions/%C0%AE%C0%AE", "", errBadUTF8, false},

		// Encoded slashes, empty segments, other forms.
		{"encoded slash", "/api/v10/channels/1%2fmessages", "", errEncodedSlash, false},
		{"encoded slash hiding a webhook", "/api/v10/webhooks%2F1%2F" + webhookToken, "", errEncodedSlash, false},
		{"double slash", "/api/v10//webhooks/1/" + webhookToken, "", errEmptySegment, false},
		{"leading double slash", "//evil.example/api/v10/users/@me", "", errEmptySegment, false},
		{"absolute-form", "http://evil.example/api/v10/users/@me", "", errNotOriginForm, false},
		{"absolute-form https", "https://discord.com/api/v10/users/@me", "", errNotOriginForm, false},
		{"authority-form", "discord.com:443", "", errNotOriginForm, false},
		{"asterisk", "*", "", errNotOriginForm, false},
		{"empty", "", "", errNotOriginForm, false},

		// Bytes that have no place in a path.
		{"encoded NUL", "/api/v10/users/%00", "", errControlByte, false},
		{"raw NUL", "/api/v10/users/\x00", "", errControlByte, false},
		{"encoded newline", "/api/v10/users/@me%0d%0aX-Injected:%201", "", errControlByte, false},
		{"encoded space", "/api/v10/channels/1/..%20", "", errControlByte, false},
		{"encoded DEL", "/api/v10/users/%7f", "", errControlByte, false},
		{"encoded question mark", "/api/v10/channels/1%3F/messages", "", errBadByte, false},
		{"encoded hash", "/api/v10/channels/1%23/messages", "", errBadByte, false},
		{"bad escape", "/api/v10/users/%zz", "", errBadEscape, false},
		{"truncated escape", "/api/v10/users/%e", "", errBadEscape, false},
		{"non-ASCII elsewhere", "/api/v10/channels/%C3%A9", "", errNonASCII, false},
		{"invalid UTF-8 emoji", "/api/v10/channels/1/messages/2/reactions/%F0%9F", "", errBadUTF8, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := checkTarget(tt.uri)
			if !errors.Is(err, tt.err) || got != tt.want {
				t.Fatalf("checkTarget(%q) = %q, %v; want %q, %v", tt.uri, got, err, tt.want, tt.err)
			}
			if err != nil {
				return
			}
			if api := isAPIPath(got); api != tt.api {
				t.Errorf("isAPIPath(%q) = %v; want %v", got, api, tt.api)
			}
			// Go's own reading of the target agrees, which the handler
			// requires.
			u, perr := url.ParseRequestURI(tt.uri)
			if perr != nil || u.Path != got {
				t.Errorf("url.ParseRequestURI(%q) = %v, %v; want path %q", tt.uri, u, perr, got)
			}
		})
	}
}

func TestTokenInPath(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path string
		want bool
	}{
		{"/api/v10/webhooks/1/tok", true},
		{"/api/v10/webhooks/1/tok/messages/2", true},
		{"/api/webhooks/1/tok", true},
		{"/api/v10/interactions/1/tok/callback", true},
		{"/api/v10/Webhooks/1/tok", true},
		{"/api/V9/INTERACTIONS/1/tok/callback", true},
		{"/api/v10/webhooks/1", false},
		{"/api/v10/webhooks/1/", false},
		{"/api/v10/channels/1/webhooks", false},
		{"/api/v10/users/@me", false},
		{"/api/v10/vx/webhooks/1/tok", false},
	}
	for _, tt := range tests {
		if got := tokenInPath(tt.path); got != tt.want {
			t.Errorf("tokenInPath(%q) = %v; want %v", tt.path, got, tt.want)
		}
	}
}

// FuzzCheckTarget checks the invariants of an accepted target: it never
// panics; the path has no dot-segment and no encoded slash however often
// it is percent-decoded, one decoding reaches its end, what is sent
// upstream decodes to it, and an API path starts with /api/.
func FuzzCheckTarget(f *testing.F) {
	for _, s := range []string{
		"/api/v10/channels/123/messages", "/api/v10/webhooks/1/tok?wait=true", "/api/v10/../../admin",
		"/api/v10/%2e%2e/admin", "/api/v10/..%2fadmin", "/api/v10/%252e%252e/x", "//x/api", "http://x/api/v10",
		"/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me", "/api/v10//webhooks/1/t", "/api/v10/.%2E/x",
		"/api/v10/channels/1/messages/2/reactions/%EF%BC%8E", "/api/%00", "/api/v10/a;b", `/api/v10/a\b`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, uri string) {
		path, err := checkTarget(uri)
		if err != nil {
			if path != "" {
				t.Fatalf("checkTarget(%q) = %q, %v; want no path with an error", uri, path, err)
			}
			return
		}
		raw, _, _ := strings.Cut(uri, "?")
		// Decode until nothing changes: no level may hold an encoded
		// slash or a dot-segment (a backslash counted as a slash).
		s := raw
		for level := 0; ; level++ {
			if strings.Contains(strings.ToLower(s), "%2f") {
				t.Fatalf("checkTarget(%q) accepted an encoded slash (decoding %d: %q)", uri, level, s)
			}
			for _, seg := range strings.FieldsFunc(s, func(r rune) bool { return r == '/' || r == '\\' }) {
				if strings.Trim(seg, ".") == "" {
					t.Fatalf("checkTarget(%q) accepted a dot-segment (decoding %d: %q)", uri, level, s)
				}
			}
			next, err := url.PathUnescape(s)
			if err != nil || next == s {
				break
			}
			if level >= 1 {
				t.Fatalf("checkTarget(%q): decoding %d changed the path again (%q); want one decoding to reach the end", uri, level+1, next)
			}
			s = next
		}
		if s != path {
			t.Fatalf("checkTarget(%q) = %q; want the decoded path %q", uri, path, s)
		}
		if strings.Contains(path, "//") {
			t.Fatalf("checkTarget(%q) = %q; want no empty segment", uri, path)
		}
		// What is sent upstream decodes to what was checked.
		esc := (&url.URL{Path: path}).EscapedPath()
		if back, err := url.PathUnescape(esc); err != nil || back != path {
			t.Fatalf("checkTarget(%q) = %q escapes to %q, which decodes to %q, %v", uri, path, esc, back, err)
		}
		if isAPIPath(path) && !strings.HasPrefix(path, "/api/") {
			t.Fatalf("isAPIPath(%q) = true without /api/", path)
		}
	})
}

// rawRequest sends request line target with method to the proxy over a new
// connection, as written, and returns the response with its body read.
func rawRequest(t *testing.T, addr, method, target string, header string) (*http.Response, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, method+" "+target+" HTTP/1.1\r\nHost: proxy.test\r\n"+header+"Connection: close\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %q: %v", method, target, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

func TestProxyRefusesUncleanTargets(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL, "-default-token", defaultTok)
	addr := strings.TrimPrefix(p.url, "http://")
	refused := []struct{ method, target string }{
		{"GET", "/api/v10/../../admin"},
		{"GET", "/api/../oauth2/authorize"},
		{"GET", "/api/v10/%2e%2e/%2e%2e/admin"},
		{"GET", "/api/v10/..%2f..%2fadmin"},
		{"GET", "/api/v10/%252e%252e/admin"},
		{"POST", "/api/v10/channels/1/../../webhooks/1/" + webhookToken},
		{"POST", "/api/v10//webhooks/1/" + webhookToken},
		{"POST", "/api/v10/webhooks%2F1%2F" + webhookToken},
		{"GET", "/api/v10/channels/1/..;/admin"},
		{"GET", `/api/v10/channels/1/..\..\admin`},
		{"GET", "/api/v10/users/%00"},
		{"GET", "http://evil.example/api/v10/users/@me"},
		{"CONNECT", "discord.com:443"},
		{"GET", "/elsewhere"},
		{"GET", "/api/v10"},
	}
	for _, tt := range refused {
		resp, body := rawRequest(t, addr, tt.method, tt.target, "")
		if resp.StatusCode != http.StatusBadRequest || resp.Header.Get(hdrReason) != "bad_path" ||
			!strings.Contains(body, `"reason":"bad_path"`) || !strings.Contains(body, `"message":"ratecord proxy: `) {
			t.Errorf("%s %s = %d %s %s; want 400 bad_path", tt.method, tt.target, resp.StatusCode, resp.Header.Get(hdrReason), body)
		}
		if strings.Contains(body, webhookToken) {
			t.Errorf("%s %s: the answer quotes the token: %s", tt.method, tt.target, body)
		}
	}
	// Go's server refuses a raw control byte and answers "OPTIONS *"
	// itself: neither reaches the upstream either.
	if resp, _ := rawRequest(t, addr, "GET", "/api/v10/users/\x01", ""); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a raw control byte = %d; want 400", resp.StatusCode)
	}
	rawRequest(t, addr, "OPTIONS", "*", "")

	// Legitimate targets pass, the default token only where it belongs,
	// and the path goes upstream as it was checked.
	for _, target := range []string{
		"/api/v10/channels/123/messages",
		"/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me",
		"/api/v10/webhooks/1/" + webhookToken + "?wait=true",
	} {
		if resp, body := rawRequest(t, addr, "PUT", target, ""); resp.StatusCode != http.StatusCreated {
			t.Errorf("PUT %s = %d %s; want the upstream's 201", target, resp.StatusCode, body)
		}
	}
	seen := up.requests()
	if len(seen) != 3 {
		t.Fatalf("upstream saw %d requests; want the 3 legitimate ones", len(seen))
	}
	wants := []struct{ uri, auth string }{
		{"/api/v10/channels/123/messages", "Bot " + defaultTok},
		{"/api/v10/channels/1/messages/2/reactions/%F0%9F%91%8D/@me", "Bot " + defaultTok},
		{"/api/v10/webhooks/1/" + webhookToken + "?wait=true", ""},
	}
	for i, w := range wants {
		if seen[i].RequestURI != w.uri || seen[i].Header.Get("Authorization") != w.auth {
			t.Errorf("upstream request %d = %s with Authorization %.12q; want %s with %.12q", i, seen[i].RequestURI,
				seen[i].Header.Get("Authorization"), w.uri, w.auth)
		}
	}
	p.stop(t)
	if logs := p.stderr.String(); strings.Contains(logs, webhookToken) || strings.Contains(logs, defaultTok) {
		t.Errorf("logs quote a token:\n%s", logs)
	}
}
