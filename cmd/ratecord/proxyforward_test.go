package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// seenRequest is what an upstream was sent.
type seenRequest struct {
	Method, RequestURI, Host string
	Header                   http.Header
	Body                     string
	Trailer                  http.Header
}

// recordingUpstream records every request and answers as the request's
// X-Answer header says.
type recordingUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

func newRecordingUpstream(t *testing.T) *recordingUpstream {
	u := &recordingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{r.Method, r.RequestURI, r.Host, r.Header.Clone(), string(body), r.Trailer.Clone()})
		u.mu.Unlock()
		h := w.Header()
		switch r.URL.Query().Get("answer") {
		case "hops":
			h.Set("Connection", "X-Resp-Hop")
			h.Set("X-Resp-Hop", "must not pass")
			h.Set("Keep-Alive", "timeout=9")
			h.Set("Proxy-Authenticate", "Basic")
			h["Set-Cookie"] = []string{"a=1", "b=2"}
			h.Set("X-Kept", "yes")
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, `{"ok":true}`)
		case "trailers":
			h.Set("Trailer", "X-Announced")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, "part one,")
			w.(http.Flusher).Flush()
			io.WriteString(w, "part two")
			h.Set("X-Announced", "a")
			h.Set(http.TrailerPrefix+"X-Unannounced", "u")
		case "stream":
			h.Set("Content-Type", "text/event-stream")
			for i := range 3 {
				fmt.Fprintf(w, "data: %d\n\n", i)
				w.(http.Flusher).Flush()
			}
		case "early":
			h.Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			h.Del("Link")
			h.Set("Content-Type", "application/json")
			io.WriteString(w, `{"after":"hints"}`)
		default:
			h.Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"1"}`)
		}
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *recordingUpstream) take() []seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen
	u.seen = nil
	return s
}

// answer is what a client got, decoded.
type answer struct {
	Informational    []int
	Status           int
	Header           http.Header
	Body             string
	Trailer          http.Header
	ContentLength    int64
	TransferEncoding []string
}

// rawExchange sends raw, a whole HTTP/1.1 request, on a new connection to
// addr and reads the answer, informational responses first.
func rawExchange(t *testing.T, addr, raw string) answer {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var a answer
	for {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("read response: %v", err)
		}
		if resp.StatusCode < 200 {
			a.Informational = append(a.Informational, resp.StatusCode)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("read body: %v", err)
		}
		resp.Header.Del("Date")
		a.Status, a.Header, a.Body, a.Trailer = resp.StatusCode, resp.Header, string(body), resp.Trailer
		a.ContentLength, a.TransferEncoding = resp.ContentLength, resp.TransferEncoding
		return a
	}
}

// TestForwardMatchesReverseProxy sends the same requests through the
// proxy's forwarding and through httputil.ReverseProxy as the proxy set it
// up, and checks that the upstream and the client see the same in both.
func TestForwardMatchesReverseProxy(t *testing.T) {
	t.Parallel()
	up := newRecordingUpstream(t)
	cfg, err := parseProxyFlags([]string{"-upstream", up.URL, "-default-token", defaultTok}, io.Discard, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	p, err := newProxy(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.close)
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.send(&recorder{ResponseWriter: w}, r)
	}))
	t.Cleanup(fast.Close)
	reverse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.rp.ServeHTTP(&recorder{ResponseWriter: w}, r)
	}))
	t.Cleanup(reverse.Close)

	const hops = "Connection: X-Hop, Authorization\r\nX-Hop: no\r\nKeep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n" +
		"Proxy-Authorization: Basic eA==\r\nTE: trailers, deflate\r\nForwarded: for=1.2.3.4\r\nX-Forwarded-For: 1.2.3.4\r\n" +
		"X-Forwarded-Host: a.example\r\nX-Forwarded-Proto: https\r\n" + hdrClientSecret + ": s3cret-s3cret-s3cret\r\n"
	requests := map[string]string{
		"get":              "GET /api/v10/users/@me HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bot " + botToken + "\r\nUser-Agent: bot/1\r\n\r\n",
		"no user agent":    "GET /api/v10/users/@me HTTP/1.1\r\nHost: proxy\r\n\r\n",
		"empty auth":       "GET /api/v10/users/@me HTTP/1.1\r\nHost: proxy\r\nAuthorization: \r\n\r\n",
		"webhook":          "POST /api/v10/webhooks/1/" + webhookToken + "?wait=true HTTP/1.1\r\nHost: proxy\r\nContent-Length: 2\r\n\r\n{}",
		"hop-by-hop":       "POST /api/v10/channels/1/messages?a=1&b=%41 HTTP/1.1\r\nHost: proxy\r\n" + hops + "Content-Type: application/json\r\nContent-Length: 16\r\n\r\n{\"content\":\"hi\"}",
		"query cleaned":    "GET /api/v10/guilds/1/members?limit=5;after=2&x=%zz HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bot " + botToken + "\r\n\r\n",
		"chunked trailers": "POST /api/v10/channels/1/messages HTTP/1.1\r\nHost: proxy\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\nX-Sum: 11\r\n\r\n",
		"response hops":    "GET /api/v10/users/@me?answer=hops HTTP/1.1\r\nHost: proxy\r\n\r\n",
		"trailers":         "GET /api/v10/users/@me?answer=trailers HTTP/1.1\r\nHost: proxy\r\nTE: trailers\r\n\r\n",
		"event stream":     "GET /api/v10/users/@me?answer=stream HTTP/1.1\r\nHost: proxy\r\n\r\n",
		"early hints":      "GET /api/v10/users/@me?answer=early HTTP/1.1\r\nHost: proxy\r\n\r\n",
	}
	for name, raw := range requests {
		t.Run(name, func(t *testing.T) {
			got := rawExchange(t, fast.Listener.Addr().String(), raw)
			gotSeen := up.take()
			want := rawExchange(t, reverse.Listener.Addr().String(), raw)
			wantSeen := up.take()
			if !reflect.DeepEqual(got, want) {
				t.Errorf("client got\n%+v\nwant (ReverseProxy)\n%+v", got, want)
			}
			for _, s := range [][]seenRequest{gotSeen, wantSeen} {
				for i := range s {
					s[i].Header.Del("Accept-Encoding") // not asked for: see TestProxyLeavesEncodingToClient
				}
			}
			if name == "chunked trailers" && len(gotSeen) == 1 && len(wantSeen) == 1 {
				// The reverse proxy sends a copy of the trailer map taken
				// before the body was read, so the trailer goes without
				// its value; the proxy sends it whole.
				if v := gotSeen[0].Trailer.Get("X-Sum"); v != "11" {
					t.Errorf("upstream got trailer X-Sum %q; want 11", v)
				}
				gotSeen[0].Trailer, wantSeen[0].Trailer = nil, nil
			}
			if !reflect.DeepEqual(gotSeen, wantSeen) {
				t.Errorf("upstream saw\n%+v\nwant (ReverseProxy)\n%+v", gotSeen, wantSeen)
			}
			if len(gotSeen) != 1 {
				t.Fatalf("upstream saw %d requests; want 1", len(gotSeen))
			}
			for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Connection", "Proxy-Authorization", "Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto", hdrClientSecret} {
				if v, ok := gotSeen[0].Header[h]; ok {
					t.Errorf("upstream got %s: %q", h, v)
				}
			}
		})
	}
}

// TestForwardClientGoneAfterTheWrite checks that a client closing its
// connection after its request reached the upstream does not cancel the
// request there: it counts at Discord all the same, and the Transport
// reads its response for its limits. The client's request is logged as
// closed (499) at once.
func TestForwardClientGoneAfterTheWrite(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	release := make(chan struct{})
	alive := make(chan bool, 1)
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-release
		alive <- r.Context().Err() == nil
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		w.WriteHeader(http.StatusOK)
	})
	p := startProxy(t, "-upstream", up.URL)
	c, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "GET /api/v10/users/@me HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bot "+botToken+"\r\n\r\n")
	<-arrived
	c.Close()
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(p.stdout.String()+p.stderr.String(), `"status":499`); {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("the client that left was not logged as closed (499) within 5 s: %s", p.stdout.String()+p.stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Had the proxy cancelled the upstream request when the client left,
	// the upstream would have seen it by now.
	time.Sleep(200 * time.Millisecond)
	close(release)
	if !<-alive {
		t.Error("the upstream request was cancelled after the client left; want it kept, as it was written")
	}
}

// TestForwardCutBodyAbortsClient checks that an upstream body that breaks
// off reaches the client cut, not whole.
func TestForwardCutBodyAbortsClient(t *testing.T) {
	t.Parallel()
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "only ten..")
		w.(http.Flusher).Flush()
		c, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			c.Close()
		}
	})
	p := startProxy(t, "-upstream", up.URL, "-retries", "0")
	resp, err := p.client.Get(p.url + "/api/v10/users/@me")
	if err != nil {
		return // cut before the headers: also not whole
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Errorf("client read %q and no error; want the body cut", b)
	}
}

// TestForwardUpgrade checks that a request switching protocols still goes
// through, by the reverse proxy.
func TestForwardUpgrade(t *testing.T) {
	t.Parallel()
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "no upgrade", http.StatusBadRequest)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		line, _ := brw.ReadString('\n')
		io.WriteString(c, strings.ToUpper(line))
	})
	p := startProxy(t, "-upstream", up.URL)
	c, err := net.Dial("tcp", strings.TrimPrefix(p.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "GET /api/v10/echo HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d; want 101", resp.StatusCode)
	}
	io.WriteString(c, "hello\n")
	if line, err := br.ReadString('\n'); err != nil || line != "HELLO\n" {
		t.Errorf("echo = %q, %v; want HELLO", line, err)
	}
}

// TestRequestLineMatchesSlog checks that the log line the proxy writes
// itself is the one slog's JSONHandler writes.
func TestRequestLineMatchesSlog(t *testing.T) {
	t.Parallel()
	zones := []*time.Location{time.UTC, time.FixedZone("X", 5*3600+30*60)}
	for i, d := range []time.Duration{0, time.Microsecond, 1500 * time.Nanosecond, 123456789 * time.Nanosecond, 3 * time.Second, 90 * time.Minute} {
		at := time.Date(2026, 11, 24, 15, 4, 5, i*123456789%1e9, zones[i%2])
		method, path, status, n := "POST", "/api/v10/webhooks/1/REDACTED", 200+i, int64(i*1000)
		var want bytes.Buffer
		h := slog.NewJSONHandler(&want, nil)
		rec := slog.NewRecord(at, slog.LevelInfo, "request", 0)
		rec.AddAttrs(slog.String("method", method), slog.String("path", path), slog.Int("status", status),
			slog.Float64("duration_ms", durationMS(d)), slog.Int64("bytes", n))
		if err := h.Handle(context.Background(), rec); err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if !writeRequestLine(&got, at, method, path, status, d, n) {
			t.Fatal("writeRequestLine refused a plain line")
		}
		if got.String() != want.String() {
			t.Errorf("line for %v:\n got %s\nwant %s", d, got.String(), want.String())
		}
		if !json.Valid(got.Bytes()) {
			t.Errorf("line %s is not JSON", got.String())
		}
	}
	for _, s := range []string{`/a"b`, `/a\b`, "/a\nb", "/é", "\x7f"} {
		if writeRequestLine(io.Discard, time.Now(), "GET", s, 200, 0, 0) {
			t.Errorf("writeRequestLine wrote path %q, which needs escaping", s)
		}
	}
}
