package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

const clientSecret = "client-secret-0123456789abcdef"

// send sends a request through the proxy with the given headers and
// returns its status and reason.
func (p *runningProxy) send(t *testing.T, method, path string, header http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, p.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(hdrReason)
}

func TestProxyClientSecret(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL, "-default-token", defaultTok, "-client-secret", clientSecret)
	tests := []struct {
		name    string
		header  http.Header
		status  int
		reason  string
		forward bool
	}{
		{"missing", http.Header{}, http.StatusUnauthorized, "client_auth", false},
		{"wrong", http.Header{hdrClientSecret: {"client-secret-0123456789abcdeX"}}, http.StatusUnauthorized, "client_auth", false},
		{"prefix", http.Header{hdrClientSecret: {clientSecret[:20]}}, http.StatusUnauthorized, "client_auth", false},
		{"twice", http.Header{hdrClientSecret: {clientSecret, "other"}}, http.StatusUnauthorized, "client_auth", false},
		{"bot token alone", http.Header{"Authorization": {"Bot " + botToken}}, http.StatusUnauthorized, "client_auth", false},
		{"right", http.Header{hdrClientSecret: {clientSecret}}, http.StatusCreated, "", true},
		{"right with a bot token", http.Header{hdrClientSecret: {clientSecret}, "Authorization": {"Bot " + botToken}}, http.StatusCreated, "", true},
	}
	for _, tt := range tests {
		before := len(up.requests())
		status, reason := p.send(t, http.MethodGet, "/api/v10/users/@me", tt.header)
		if status != tt.status || reason != tt.reason {
			t.Errorf("%s: %d %q; want %d %q", tt.name, status, reason, tt.status, tt.reason)
		}
		if got := len(up.requests()) > before; got != tt.forward {
			t.Errorf("%s: forwarded = %v; want %v", tt.name, got, tt.forward)
		}
	}
	seen := up.requests()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests; want 2", len(seen))
	}
	for i, want := range []string{"Bot " + defaultTok, "Bot " + botToken} {
		if got := seen[i].Header.Get("Authorization"); got != want {
			t.Errorf("request %d: Authorization %.12q; want %.12q", i, got, want)
		}
		if seen[i].Header.Get(hdrClientSecret) != "" {
			t.Errorf("request %d: the client secret was forwarded", i)
		}
	}
	if status, _ := p.send(t, http.MethodGet, "/healthz", http.Header{}); status != http.StatusOK {
		t.Errorf("/healthz without the secret = %d; want 200", status)
	}
	p.stop(t)
	if logs := p.stderr.String(); strings.Contains(logs, clientSecret[:12]) || strings.Contains(logs, defaultTok) {
		t.Errorf("logs quote a secret:\n%s", logs)
	}
}

func TestProxyAllowedTokens(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL, "-allowed-tokens", botToken+", Bearer oauth-token", "-client-secret", clientSecret)
	tests := []struct {
		name   string
		path   string
		header http.Header
		status int
	}{
		{"allowed bot token", "/api/v10/users/@me", http.Header{"Authorization": {"Bot " + botToken}}, http.StatusCreated},
		{"allowed bearer", "/api/v10/users/@me", http.Header{"Authorization": {"Bearer oauth-token"}}, http.StatusCreated},
		{"other bot token", "/api/v10/users/@me", http.Header{"Authorization": {"Bot " + otherToken}}, http.StatusUnauthorized},
		{"bare allowed token", "/api/v10/users/@me", http.Header{"Authorization": {botToken}}, http.StatusUnauthorized},
		{"other bot token with the secret", "/api/v10/users/@me", http.Header{"Authorization": {"Bot " + otherToken}, hdrClientSecret: {clientSecret}}, http.StatusCreated},
		{"webhook without the secret", "/api/v10/webhooks/1/" + webhookToken, http.Header{}, http.StatusUnauthorized},
		{"webhook with the secret", "/api/v10/webhooks/1/" + webhookToken, http.Header{hdrClientSecret: {clientSecret}}, http.StatusCreated},
	}
	for _, tt := range tests {
		if status, reason := p.send(t, http.MethodGet, tt.path, tt.header); status != tt.status {
			t.Errorf("%s: %d %s; want %d", tt.name, status, reason, tt.status)
		}
	}
}

func TestParseProxyFlagsClientAuth(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	bad := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-addr", "0.0.0.0:0", "-allow-remote", "-default-token", "x"}, nil, "needs -client-secret"},
		{[]string{"-addr", "0.0.0.0:0", "-allow-remote"}, map[string]string{"RATECORD_DEFAULT_TOKEN": "x", "RATECORD_ALLOWED_TOKENS": "y"}, "needs -client-secret"},
		{[]string{"-default-token", "x", "-allowed-tokens", "y"}, nil, "needs -client-secret"},
		{[]string{"-client-secret", "short"}, nil, "at least 16 bytes"},
		{[]string{"-max-conns", "0"}, nil, "-max-conns must be positive"},
		{[]string{"-max-in-flight", "-1"}, nil, "-max-in-flight must be positive"},
		{[]string{"-max-auth-bytes", "0"}, nil, "-max-auth-bytes must be positive"},
		{[]string{"-max-header-bytes", "0"}, nil, "-max-header-bytes must be positive"},
	}
	for _, tt := range bad {
		_, err := parseProxyFlags(tt.args, io.Discard, env(tt.env))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseProxyFlags(%q, %v) = %v; want a usage error containing %q", tt.args, tt.env, err, tt.want)
		}
	}
	// The command refuses to start, with a usage error.
	var stderr syncBuffer
	if code := run(t.Context(), []string{"proxy", "-addr", "0.0.0.0:0", "-allow-remote", "-default-token", "x"}, io.Discard, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "needs -client-secret") {
		t.Errorf("ratecord proxy -allow-remote -default-token: exit %d, %q; want 2 and a message naming -client-secret", code, stderr.String())
	}
	cfg, err := parseProxyFlags([]string{"-addr", "0.0.0.0:0", "-allow-remote", "-default-token", "x"}, io.Discard,
		env(map[string]string{"RATECORD_CLIENT_SECRET": clientSecret, "RATECORD_ALLOWED_TOKENS": botToken + "," + otherToken}))
	if err != nil {
		t.Fatalf("-allow-remote, -default-token and RATECORD_CLIENT_SECRET: %v", err)
	}
	a := cfg.auth
	if !a.enabled() || !a.bySecret(http.Header{hdrClientSecret: {clientSecret}}) || !a.byCredential("Bot "+otherToken) || a.byCredential("Bot x") {
		t.Errorf("client authentication from the environment does not work: %+v", a)
	}
	// Neither the secret nor a token is kept, in any form that prints.
	if dump := fmt.Sprintf("%+v %#v", *a, *a); strings.Contains(dump, clientSecret) || strings.Contains(dump, botToken) {
		t.Errorf("clientAuth keeps a raw secret: %s", dump)
	}
	if cfg, err := parseProxyFlags(nil, io.Discard, env(nil)); err != nil || cfg.auth.enabled() ||
		cfg.maxConns != 1024 || cfg.maxInFlight != 512 || cfg.maxAuthBytes != 512 || cfg.maxHeaderBytes != 32<<10 {
		t.Errorf("defaults: %+v, %v; want no client authentication and the documented caps", cfg, err)
	}
}
