package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// Tokens the tests send; none may appear in the proxy's logs.
const (
	botToken     = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GhIjKl.secret-bot-token-abcdefghijklmnop"
	otherToken   = "OTg3NjU0MzIxMDk4NzY1NDMy.XyZaBc.other-bot-token-qrstuvwxyz012345"
	defaultTok   = "ODc2NTQzMjEwOTg3NjU0MzIx.DeFgHi.default-token-6789abcdefghijkl"
	webhookToken = "hA6cXzTUsyIEPl2rsoVnrm5bUgXvYbMzumVqpIsTGwQtb0ZD1Ow5IS8Q2-UEUyR8Y0Tp"
	shortToken   = "shortsecret"
)

// runningProxy is a "ratecord proxy" started by a test.
type runningProxy struct {
	url    string
	stdout *syncBuffer
	stderr *syncBuffer
	cancel context.CancelFunc
	done   chan int
	client *http.Client

	stopOnce sync.Once
}

// startProxy runs "ratecord proxy" on a free loopback port with args, and
// stops it when t ends.
func startProxy(t *testing.T, args ...string) *runningProxy {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &runningProxy{stdout: &syncBuffer{}, stderr: &syncBuffer{}, cancel: cancel, done: make(chan int, 1)}
	all := append([]string{"proxy", "-addr", "127.0.0.1:0"}, args...)
	go func() { p.done <- run(ctx, all, p.stdout, p.stderr) }()
	urlRE := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if m := urlRE.FindStringSubmatch(p.stdout.String()); m != nil {
			p.url = m[1]
			break
		}
		select {
		case code := <-p.done:
			cancel()
			t.Fatalf("proxy exited with %d before listening: %s", code, p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("proxy did not print its URL: %q", p.stdout.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	p.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		p.stop(t)
		tr.CloseIdleConnections()
	})
	return p
}

// stop cancels the proxy's context and waits for it to exit with status 0.
func (p *runningProxy) stop(t *testing.T) {
	t.Helper()
	p.stopOnce.Do(func() {
		p.cancel()
		select {
		case code := <-p.done:
			if code != 0 {
				t.Errorf("proxy exited with %d: %s", code, p.stderr.String())
			}
		case <-time.After(15 * time.Second):
			t.Error("proxy did not stop after cancel")
		}
	})
}

// do sends a request through the proxy and returns the response with its
// body read.
func (p *runningProxy) do(t *testing.T, method, path, auth, body string) (*http.Response, string) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, p.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, path, err)
	}
	return resp, string(b)
}

// echo is an upstream that records what it was sent and answers with a
// fixed body and headers.
type echo struct {
	*httptest.Server
	mu   sync.Mutex // guards seen
	seen []*http.Request
}

func newEcho(t *testing.T, handle func(w http.ResponseWriter, r *http.Request)) *echo {
	e := &echo{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		e.seen = append(e.seen, r.Clone(context.Background()))
		e.mu.Unlock()
		if handle != nil {
			handle(w, r)
			return
		}
		w.Header().Set("X-Upstream", "echo")
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"42"}`)
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *echo) requests() []*http.Request {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]*http.Request(nil), e.seen...)
}

func TestProxyForwardsRequestsIntact(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL)

	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.url+"/api/v10/channels/123/messages?wait=true&x=%2F", strings.NewReader(`{"content":"hi"}`))
	req.Header.Set("Authorization", "Bot "+botToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Audit-Log-Reason", "testing")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "must not pass")
	req.Header.Set("Keep-Alive", "timeout=5")
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != `{"id":"42"}` {
		t.Errorf("response = %d %q; want 201 {\"id\":\"42\"}", resp.StatusCode, body)
	}
	if resp.Header.Get("X-Upstream") != "echo" || resp.Header.Get("X-RateLimit-Bucket") != "abcd" {
		t.Errorf("response headers = %v; want the upstream's", resp.Header)
	}

	seen := up.requests()
	if len(seen) != 1 {
		t.Fatalf("upstream saw %d requests; want 1", len(seen))
	}
	got := seen[0]
	upHost := strings.TrimPrefix(up.URL, "http://")
	checks := []struct{ name, got, want string }{
		{"method", got.Method, http.MethodPost},
		{"path", got.URL.Path, "/api/v10/channels/123/messages"},
		{"query", got.URL.RawQuery, "wait=true&x=%2F"},
		{"host", got.Host, upHost},
		{"authorization", got.Header.Get("Authorization"), "Bot " + botToken},
		{"reason header", got.Header.Get("X-Audit-Log-Reason"), "testing"},
		{"hop-by-hop header", got.Header.Get("X-Hop"), ""},
		{"keep-alive", got.Header.Get("Keep-Alive"), ""},
		{"x-forwarded-for", got.Header.Get("X-Forwarded-For"), ""},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("upstream %s = %q; want %q", c.name, c.got, c.want)
		}
	}
}

// TestProxyLeavesEncodingToClient checks that the proxy asks the upstream
// for no encoding of its own and passes the client's through, with the
// answer as the upstream encoded it.
func TestProxyLeavesEncodingToClient(t *testing.T) {
	t.Parallel()
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Accept-Encoding") == "gzip" {
			w.Header().Set("Content-Encoding", "gzip")
		}
		io.WriteString(w, "body")
	})
	p := startProxy(t, "-upstream", up.URL)
	client := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(client.CloseIdleConnections)
	for _, enc := range []string{"", "gzip"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, p.url+"/api/v10/users/@me", nil)
		req.Header.Set("Authorization", "Bot "+botToken)
		if enc != "" {
			req.Header.Set("Accept-Encoding", enc)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get("Content-Encoding"); got != enc {
			t.Errorf("Accept-Encoding %q: response Content-Encoding = %q; want %q", enc, got, enc)
		}
	}
	seen := up.requests()
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests; want 2", len(seen))
	}
	for i, want := range []string{"", "gzip"} {
		if got := seen[i].Header.Get("Accept-Encoding"); got != want {
			t.Errorf("request %d: upstream Accept-Encoding = %q; want %q", i, got, want)
		}
	}
}

func TestProxyForwardsEmulatorResponses(t *testing.T) {
	t.Parallel()
	emu := discordtest.NewServer()
	t.Cleanup(emu.Close)
	p := startProxy(t, "-upstream", emu.URL())

	resp, body := p.do(t, http.MethodGet, "/api/v10/users/@me", "Bot "+botToken, "")
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /users/@me = %d %s; want 200", resp.StatusCode, body)
	}
	for _, h := range []string{"X-RateLimit-Bucket", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset-After", "Via"} {
		if resp.Header.Get(h) == "" {
			t.Errorf("response lacks %s: %v", h, resp.Header)
		}
	}
	if !json.Valid([]byte(body)) {
		t.Errorf("body %q is not JSON", body)
	}
	if resp, body := p.do(t, http.MethodGet, "/elsewhere", "", ""); resp.StatusCode != http.StatusBadRequest || !strings.Contains(body, `"bad_path"`) {
		t.Errorf("GET /elsewhere = %d %s; want 400 bad_path", resp.StatusCode, body)
	}
}

func TestProxyKeepsBucketLimits(t *testing.T) {
	t.Parallel()
	emu := discordtest.NewServer(discordtest.WithTimeScale(0.1))
	t.Cleanup(emu.Close)
	p := startProxy(t, "-upstream", emu.URL(), "-log-level", "warn")

	// Two bots, two channels each, 5 messages per 0.5 s per channel: 48
	// messages from 16 goroutines take about 2 s.
	var wg sync.WaitGroup
	statuses := make(chan int, 48)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tok := []string{botToken, otherToken}[g%2]
			for i := range 3 {
				path := fmt.Sprintf("/api/v10/channels/%d/messages", 100+(g+i)%2)
				resp, _ := p.do(t, http.MethodPost, path, "Bot "+tok, `{"content":"hi"}`)
				statuses <- resp.StatusCode
			}
		}()
	}
	wg.Wait()
	close(statuses)
	for s := range statuses {
		if s != http.StatusOK {
			t.Errorf("a message got status %d; want 200", s)
		}
	}
	st := emu.Stats()
	if st.ByStatus[429] != 0 || st.Avoidable != 0 || st.Requests != 48 {
		t.Errorf("emulator: %d requests, %d 429s (%d avoidable); want 48 requests and no 429", st.Requests, st.ByStatus[429], st.Avoidable)
	}
}

// redisServer starts a redis-server on a free loopback port for t. It skips
// t without redis-server, or fails it when CI is "true".
func redisServer(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		msg := "no redis-server on PATH"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "no", "--dir", t.TempDir(), "--loglevel", "warning")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not start: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestProxyReplicasShareLimitsThroughRedis(t *testing.T) {
	t.Parallel()
	addr := redisServer(t)
	emu := discordtest.NewServer(discordtest.WithTimeScale(0.1))
	t.Cleanup(emu.Close)
	prefix := fmt.Sprintf("proxytest%d", time.Now().UnixNano())
	replicas := []*runningProxy{
		startProxy(t, "-upstream", emu.URL(), "-redis", addr, "-redis-prefix", prefix, "-log-level", "warn"),
		startProxy(t, "-upstream", emu.URL(), "-redis", addr, "-redis-prefix", prefix, "-log-level", "warn"),
	}
	// One bot on one channel through both replicas: 30 messages at 5 per
	// 0.5 s, and a global limit the messages of several channels share.
	var wg sync.WaitGroup
	var mu sync.Mutex
	statuses := map[int]int{}
	for g := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := replicas[g%2]
			for i := range 3 {
				path := fmt.Sprintf("/api/v10/channels/%d/messages", 7+(g+i)%3)
				resp, _ := p.do(t, http.MethodPost, path, "Bot "+botToken, `{"content":"hi"}`)
				mu.Lock()
				statuses[resp.StatusCode]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if statuses[http.StatusOK] != 30 {
		t.Errorf("statuses = %v; want 30 × 200", statuses)
	}
	st := emu.Stats()
	if st.ByStatus[429] != 0 || st.Avoidable != 0 {
		t.Errorf("emulator: %d 429s (%d avoidable) through two replicas; want none", st.ByStatus[429], st.Avoidable)
	}
}

func TestProxyGiveUpResponse(t *testing.T) {
	t.Parallel()
	emu := discordtest.NewServer()
	t.Cleanup(emu.Close)
	p := startProxy(t, "-upstream", emu.URL(), "-max-wait", "200ms")

	// The bucket allows 5 messages per 5 s: the sixth would wait seconds.
	path := "/api/v10/channels/55/messages"
	for i := range 5 {
		if resp, body := p.do(t, http.MethodPost, path, "Bot "+botToken, `{"content":"hi"}`); resp.StatusCode != http.StatusOK {
			t.Fatalf("message %d = %d %s; want 200", i, resp.StatusCode, body)
		}
	}
	resp, body := p.do(t, http.MethodPost, path, "Bot "+botToken, `{"content":"hi"}`)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("sixth message = %d %s; want 429 from the proxy", resp.StatusCode, body)
	}
	var got errorBody
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("body %q: %v", body, err)
	}
	if got.Ratecord.Reason != "wait_too_long" || got.Ratecord.Route != "POST /channels/:id/messages" ||
		got.Ratecord.Bucket == "" || got.RetryAfter <= 0 || got.RetryAfter > 5.1 || got.Global == nil || *got.Global ||
		got.Message != "ratecord: wait exceeds the maximum" {
		t.Errorf("body = %s; want reason wait_too_long, the route, a bucket, retry_after in (0, 5.1], global false", body)
	}
	ra, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || ra < 1 || ra > 6 {
		t.Errorf("Retry-After = %q; want whole seconds in [1, 6]", resp.Header.Get("Retry-After"))
	}
	for h, want := range map[string]string{
		hdrReason:      "wait_too_long",
		hdrBucket:      got.Ratecord.Bucket,
		hdrRetryAfter:  strconv.FormatFloat(got.RetryAfter, 'f', 3, 64),
		"Content-Type": "application/json",
	} {
		if resp.Header.Get(h) != want {
			t.Errorf("%s = %q; want %q", h, resp.Header.Get(h), want)
		}
	}
	if st := emu.Stats(); st.ByStatus[429] != 0 {
		t.Errorf("emulator answered %d 429s; want none", st.ByStatus[429])
	}
}

func TestProxyUpstreamDown(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	p := startProxy(t, "-upstream", dead, "-retries", "0")
	resp, body := p.do(t, http.MethodGet, "/api/v10/webhooks/1/"+webhookToken, "", "")
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(hdrReason) != "upstream_error" {
		t.Errorf("GET through a dead upstream = %d %s; want 502 upstream_error", resp.StatusCode, body)
	}
	if strings.Contains(body, webhookToken) {
		t.Errorf("error body quotes the webhook token: %s", body)
	}
	p.stop(t)
	logs := p.stderr.String()
	if !strings.Contains(logs, `"reason":"upstream_error","error":"`) {
		t.Errorf("logs lack the upstream's error:\n%s", logs)
	}
	for i := 0; i+9 <= len(webhookToken); i++ {
		if strings.Contains(logs, webhookToken[i:i+9]) {
			t.Fatalf("logs hold %q of the webhook token:\n%s", webhookToken[i:i+9], logs)
		}
	}
}

func TestProxyNeverLogsTokens(t *testing.T) {
	t.Parallel()
	emu := discordtest.NewServer()
	t.Cleanup(emu.Close)
	p := startProxy(t, "-upstream", emu.URL(), "-max-wait", "100ms", "-log-level", "debug", "-default-token", defaultTok)
	for i := range 7 { // the last ones give up
		p.do(t, http.MethodPost, "/api/v10/channels/9/messages", "Bot "+botToken, `{"content":"hi"}`)
		p.do(t, http.MethodPost, "/api/v10/webhooks/77/"+webhookToken+"?wait=true", "", `{"content":"hi"}`)
		p.do(t, http.MethodPatch, "/api/v10/webhooks/77/"+shortToken+"/messages/1", "", `{"content":"hi"}`)
		p.do(t, http.MethodPost, "/api/v10/interactions/88/"+webhookToken+"/callback", "", `{"type":1}`)
		p.do(t, http.MethodGet, "/api/v10/users/@me", "", "")
		_ = i
	}
	p.stop(t)
	logs := p.stderr.String()
	for _, secret := range []string{botToken, webhookToken, shortToken, defaultTok} {
		if strings.Contains(logs, secret) {
			t.Errorf("logs contain a token (%.8s...):\n%s", secret, logs)
		}
	}
	if !strings.Contains(logs, `"path":"/api/v10/webhooks/77/REDACTED"`) || !strings.Contains(logs, `"reason":"wait_too_long"`) {
		t.Errorf("logs lack the redacted webhook path or the give-up:\n%s", logs)
	}
	for line := range strings.SplitSeq(strings.TrimSpace(logs), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line is not JSON: %s", line)
		}
	}
}

func TestProxyHealthAndMetrics(t *testing.T) {
	t.Parallel()
	emu := discordtest.NewServer()
	t.Cleanup(emu.Close)
	p := startProxy(t, "-upstream", emu.URL())
	if resp, body := p.do(t, http.MethodGet, "/healthz", "", ""); resp.StatusCode != http.StatusOK || body != "ok" {
		t.Errorf("GET /healthz = %d %q; want 200 ok", resp.StatusCode, body)
	}
	p.do(t, http.MethodGet, "/api/v10/users/@me", "Bot "+botToken, "")
	resp, body := p.do(t, http.MethodGet, "/metrics", "", "")
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{
		"discord_ratelimit_wait_duration_seconds_bucket",
		"discord_ratelimit_queued",
		`url_template="/users/@me"`,
		"process_resident_memory_bytes",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s:\n%s", want, body)
		}
	}
	if strings.Contains(body, botToken) {
		t.Error("/metrics contains a token")
	}
}

func TestProxyDefaultToken(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL, "-default-token", defaultTok)
	tests := []struct {
		method, path, auth, want string
	}{
		{"GET", "/api/v10/users/@me", "", "Bot " + defaultTok},
		{"GET", "/api/v10/users/@me", "Bot " + otherToken, "Bot " + otherToken},
		{"GET", "/api/v10/webhooks/1", "", "Bot " + defaultTok},
		{"POST", "/api/v10/webhooks/1/" + webhookToken, "", ""},
		{"PATCH", "/api/webhooks/1/" + webhookToken + "/messages/@original", "", ""},
		{"POST", "/api/v9/interactions/2/" + webhookToken + "/callback", "", ""},
		{"GET", "/api/v10/channels/3", "", "Bot " + defaultTok},
	}
	for _, tt := range tests {
		p.do(t, tt.method, tt.path, tt.auth, "")
	}
	seen := up.requests()
	if len(seen) != len(tests) {
		t.Fatalf("upstream saw %d requests; want %d", len(seen), len(tests))
	}
	for i, tt := range tests {
		if got := seen[i].Header.Get("Authorization"); got != tt.want {
			t.Errorf("%s %s with Authorization %q: upstream got %q; want %q", tt.method, tt.path, tt.auth, got, tt.want)
		}
	}
}

func TestProxyBodyLimit(t *testing.T) {
	t.Parallel()
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		_, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	p := startProxy(t, "-upstream", up.URL, "-max-body", "1024", "-replay-body", "512")
	big := strings.Repeat("x", 2048)
	for _, tt := range []struct {
		name    string
		body    io.Reader
		wantUp  bool
		wantSts int
	}{
		{"declared length", strings.NewReader(big), false, http.StatusRequestEntityTooLarge},
		{"chunked", io.MultiReader(strings.NewReader(big)), false, http.StatusRequestEntityTooLarge},
		{"small", strings.NewReader(strings.Repeat("y", 1000)), true, http.StatusOK},
	} {
		before := len(up.requests())
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.url+"/api/v10/channels/1/messages", tt.body)
		req.Header.Set("Authorization", "Bot "+botToken)
		resp, err := p.client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.wantSts {
			t.Errorf("%s: status %d %s; want %d", tt.name, resp.StatusCode, body, tt.wantSts)
		}
		if tt.wantSts == http.StatusRequestEntityTooLarge && resp.Header.Get(hdrReason) != "body_too_large" {
			t.Errorf("%s: %s = %q; want body_too_large", tt.name, hdrReason, resp.Header.Get(hdrReason))
		}
		if tt.name == "declared length" && len(up.requests()) != before {
			t.Errorf("%s: the upstream was sent the request", tt.name)
		}
	}
}

func TestProxyRetriesBufferedBodiesAfter429(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var bodies []string
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies = append(bodies, string(b))
		first := len(bodies) == 1
		mu.Unlock()
		if first {
			w.Header().Set("X-RateLimit-Scope", "shared")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"message":"You are being rate limited.","retry_after":0.05,"global":false}`)
			return
		}
		io.WriteString(w, `{"id":"1"}`)
	})
	p := startProxy(t, "-upstream", up.URL)
	resp, body := p.do(t, http.MethodPost, "/api/v10/channels/1/messages", "Bot "+botToken, `{"content":"again"}`)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d %s; want 200 after a retry", resp.StatusCode, body)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 2 || bodies[1] != `{"content":"again"}` {
		t.Errorf("upstream bodies = %q; want the same body twice", bodies)
	}
}

func TestProxyGracefulShutdown(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	release := make(chan struct{})
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		io.WriteString(w, `{"id":"slow"}`)
	})
	p := startProxy(t, "-upstream", up.URL, "-shutdown-timeout", "10s")

	type result struct {
		status int
		body   string
		err    error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := p.client.Get(p.url + "/api/v10/users/@me")
		if err != nil {
			got <- result{err: err}
			return
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		got <- result{resp.StatusCode, string(b), err}
	}()
	<-arrived
	p.cancel()
	// Shutdown has begun when new connections are refused.
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(p.url, "http://"), 100*time.Millisecond)
		if err != nil {
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Fatal("proxy still accepts connections after cancel")
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case <-p.done:
		t.Fatal("proxy returned before its request in flight finished")
	default:
	}
	close(release)
	r := <-got
	if r.err != nil || r.status != http.StatusOK || r.body != `{"id":"slow"}` {
		t.Errorf("request in flight during shutdown: %d %q %v; want 200 {\"id\":\"slow\"}", r.status, r.body, r.err)
	}
}

func TestParseProxyFlags(t *testing.T) {
	t.Parallel()
	env := func(m map[string]string) func(string) (string, bool) {
		return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
	}
	cfg, err := parseProxyFlags([]string{"-max-wait", "5s"}, io.Discard, env(map[string]string{
		"RATECORD_MAX_WAIT":      "9s",
		"RATECORD_UPSTREAM":      "http://127.0.0.1:1",
		"RATECORD_REDIS":         "a:1, b:2",
		"RATECORD_DEFAULT_TOKEN": "abc",
		"RATECORD_REDIS_FAIL":    "closed",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.maxWait != 5*time.Second || cfg.upstream.String() != "http://127.0.0.1:1" || len(cfg.redisAddrs) != 2 ||
		cfg.defaultAuth != "Bot abc" || cfg.redisFail.String() != "fail-closed" {
		t.Errorf("config = %+v; want the flag over the environment, the rest from the environment", cfg)
	}

	bad := []struct {
		args []string
		env  map[string]string
		want string
	}{
		{[]string{"-addr", "0.0.0.0:8080"}, nil, "not a loopback address"},
		{nil, map[string]string{"RATECORD_ADDR": "[::]:80"}, "not a loopback address"},
		{[]string{"-upstream", "ftp://x"}, nil, "not an http or https URL"},
		{[]string{"-redis-fail", "maybe"}, nil, "want open or closed"},
		{nil, map[string]string{"RATECORD_MAX_BODY": "lots"}, "RATECORD_MAX_BODY"},
		{[]string{"-max-wait", "3m"}, nil, "must exceed -max-wait"},
		{[]string{"-log-level", "loud"}, nil, "-log-level"},
	}
	for _, tt := range bad {
		_, err := parseProxyFlags(tt.args, io.Discard, env(tt.env))
		var ue *usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseProxyFlags(%q, %v) = %v; want a usage error containing %q", tt.args, tt.env, err, tt.want)
		}
	}
	if _, err := parseProxyFlags([]string{"-addr", "0.0.0.0:0", "-allow-remote"}, io.Discard, env(nil)); err != nil {
		t.Errorf("-allow-remote: %v", err)
	}
}

func TestProxyRedactError(t *testing.T) {
	t.Parallel()
	p := &proxy{cfg: &proxyConfig{defaultAuth: "Bot " + defaultTok}}
	r := httptest.NewRequest(http.MethodPost, "/api/v10/webhooks/1/"+shortToken+"?wait=true", nil)
	r.Header.Set("Authorization", "Bot "+botToken)
	err := fmt.Errorf("upstream: %w", &url.Error{
		Op:  "Post",
		URL: "https://discord.com/api/v10/webhooks/1/" + shortToken + "?wait=true",
		Err: fmt.Errorf("sent %s as Bot %s: %w", r.URL.Path, botToken, io.ErrUnexpectedEOF),
	})
	got := p.redactError(err, r)
	for _, secret := range []string{shortToken, botToken, defaultTok, "wait=true"} {
		if strings.Contains(got, secret) {
			t.Errorf("redactError(%q) = %q; holds %.8q", err, got, secret)
		}
	}
	if want := `upstream: Post "https://discord.com/api/v10/webhooks/1/REDACTED": sent /api/v10/webhooks/1/REDACTED as REDACTED: unexpected EOF`; got != want {
		t.Errorf("redactError = %q; want %q", got, want)
	}
}

func TestProxyDetectsGlobalLimit(t *testing.T) {
	t.Parallel()
	emu := discordtest.NewServer(discordtest.WithMaxConcurrency(16))
	t.Cleanup(emu.Close)
	p := startProxy(t, "-upstream", emu.URL(), "-detect-global-limit")
	if resp, body := p.do(t, http.MethodGet, "/api/v10/users/@me", "Bot "+botToken, ""); resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /users/@me = %d %s; want 200", resp.StatusCode, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		asked := 0
		for _, e := range emu.Stats().Log {
			if strings.HasSuffix(e.Route, "/gateway/bot") {
				asked++
			}
		}
		if asked == 1 {
			break
		}
		if asked > 1 || time.Now().After(deadline) {
			t.Fatalf("the emulator saw %d GET /gateway/bot; want one", asked)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
