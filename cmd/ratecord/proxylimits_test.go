package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestProxyAuthorizationCap(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL, "-max-auth-bytes", "100")
	addr := strings.TrimPrefix(p.url, "http://")
	long := "Bot " + strings.Repeat("x", 97)
	if status, reason := p.send(t, http.MethodGet, "/api/v10/users/@me", http.Header{"Authorization": {long}}); status != http.StatusBadRequest || reason != "bad_authorization" {
		t.Errorf("101-byte Authorization: %d %q; want 400 bad_authorization", status, reason)
	}
	if status, reason := p.send(t, http.MethodGet, "/api/v10/users/@me", http.Header{"Authorization": {long[:100]}}); status != http.StatusCreated {
		t.Errorf("100-byte Authorization: %d %q; want the upstream's 201", status, reason)
	}
	if status, reason := p.send(t, http.MethodGet, "/api/v10/users/@me", http.Header{"Authorization": {"Bot a", "Bot b"}}); status != http.StatusBadRequest || reason != "bad_authorization" {
		t.Errorf("two Authorization headers: %d %q; want 400 bad_authorization", status, reason)
	}
	// 1 MiB is over -max-header-bytes: Go's server answers 431 itself.
	huge := "Authorization: Bot " + strings.Repeat("y", 1<<20) + "\r\n"
	if resp, _ := rawRequest(t, addr, "GET", "/api/v10/users/@me", huge); resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("1 MiB Authorization: %d; want 431", resp.StatusCode)
	}
	if n := len(up.requests()); n != 1 {
		t.Errorf("upstream saw %d requests; want 1", n)
	}
}

func TestProxyInFlightCap(t *testing.T) {
	t.Parallel()
	var arrived atomic.Int32
	release := make(chan struct{})
	up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		<-release
		io.WriteString(w, `{}`)
	})
	p := startProxy(t, "-upstream", up.URL, "-max-in-flight", "2")
	var wg sync.WaitGroup
	for ch := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Two channels: each its own bucket, so both go out at once.
			p.send(t, http.MethodGet, fmt.Sprintf("/api/v10/channels/%d", ch), http.Header{"Authorization": {"Bot " + botToken}})
		}()
	}
	for deadline := time.Now().Add(10 * time.Second); arrived.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first two requests did not reach the upstream")
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, p.url+"/api/v10/channels/3", nil)
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get(hdrReason) != "overloaded" || resp.Header.Get("Retry-After") != "1" {
		t.Errorf("third request = %d %q, Retry-After %q; want 503 overloaded, 1", resp.StatusCode, resp.Header.Get(hdrReason), resp.Header.Get("Retry-After"))
	}
	close(release)
	wg.Wait()
	if status, _ := p.send(t, http.MethodGet, "/api/v10/channels/3", http.Header{}); status != http.StatusOK {
		t.Errorf("after the two finished: %d; want 200", status)
	}
}

func TestLimitListener(t *testing.T) {
	t.Parallel()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := newLimitListener(inner, 3)
	accepted := make(chan net.Conn, 20)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for range 10 {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, c)
	}
	var held []net.Conn
	take := func(n int) {
		t.Helper()
		for range n {
			select {
			case c := <-accepted:
				held = append(held, c)
			case <-time.After(5 * time.Second):
				t.Fatalf("accepted %d connections; want %d", len(held), n)
			}
		}
		select {
		case <-accepted:
			t.Fatalf("accepted more than the cap: %d open", l.open())
		case <-time.After(100 * time.Millisecond):
		}
		if l.open() != 3 {
			t.Fatalf("open = %d; want 3", l.open())
		}
	}
	take(3)
	held[0].Close()
	held[0].Close() // a second Close gives back nothing more
	held[1].Close()
	take(2)
	l.Close()
	<-done
	for _, c := range append(clients, held...) {
		c.Close()
	}
}

func TestProxyConnectionCap(t *testing.T) {
	t.Parallel()
	up := newEcho(t, nil)
	p := startProxy(t, "-upstream", up.URL, "-max-conns", "4", "-idle-timeout", "1m")
	addr := strings.TrimPrefix(p.url, "http://")
	type conn struct {
		net.Conn
		r *bufio.Reader
	}
	dial := func() conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return conn{c, bufio.NewReader(c)}
	}
	get := func(c conn, wait time.Duration) error {
		c.SetDeadline(time.Now().Add(wait))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: proxy.test\r\n\r\n"); err != nil {
			return err
		}
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		return resp.Body.Close()
	}
	// Four keep-alive connections, each answered once and left open.
	var open []conn
	for i := range 4 {
		c := dial()
		if err := get(c, 5*time.Second); err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		open = append(open, c)
	}
	// Sixteen more are not served while the four stay open.
	var waiting []conn
	for range 16 {
		c := dial()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: proxy.test\r\n\r\n")
		waiting = append(waiting, c)
	}
	waiting[0].SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if _, err := http.ReadResponse(waiting[0].r, nil); err == nil {
		t.Fatal("a fifth connection was served while four were open")
	}
	waiting[0].Close()
	// Closing the four lets the waiting ones through, four at a time.
	for _, c := range open {
		c.Close()
	}
	for i, c := range waiting[1:] {
		c.SetDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(c.r, nil)
		if err != nil {
			t.Fatalf("waiting connection %d: %v", i+1, err)
		}
		resp.Body.Close()
		c.Close()
	}
}

// TestProxyBufferedBodiesCap checks that bodies are buffered for a retry of
// a 429 only while the bodies buffered at once fit -max-buffered: one that
// does not fit is streamed, and its 429 reaches the client.
func TestProxyBufferedBodiesCap(t *testing.T) {
	t.Parallel()
	run := func(t *testing.T, maxBuffered string) (status, attempts int) {
		var calls atomic.Int32
		up := newEcho(t, func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			if calls.Add(1) == 1 {
				w.Header().Set("X-RateLimit-Scope", "shared")
				w.Header().Set("Retry-After", "1")
				w.Header().Set("Via", "1.1 google")
				w.WriteHeader(http.StatusTooManyRequests)
				io.WriteString(w, `{"message":"busy","retry_after":0.01,"global":false}`)
				return
			}
			io.WriteString(w, `{}`)
		})
		p := startProxy(t, "-upstream", up.URL, "-max-buffered", maxBuffered)
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, p.url+"/api/v10/channels/1/messages", strings.NewReader(`{"content":"hello there"}`))
		req.Header.Set("Authorization", "Bot "+botToken)
		resp, err := p.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, int(calls.Load())
	}
	if status, n := run(t, "1024"); status != http.StatusOK || n != 2 {
		t.Errorf("with room to buffer: %d after %d attempts; want 200 after 2 (the 429 retried)", status, n)
	}
	if status, n := run(t, "10"); status != http.StatusTooManyRequests || n != 1 {
		t.Errorf("with no room to buffer: %d after %d attempts; want the 429 after 1", status, n)
	}
}

func TestReserveBuffer(t *testing.T) {
	p := &proxy{cfg: &proxyConfig{maxBuffered: 100}}
	if !p.reserveBuffer(60) {
		t.Fatal("reserveBuffer(60) of 100 = false; want true")
	}
	if p.reserveBuffer(60) {
		t.Fatal("reserveBuffer(60) with 60 of 100 taken = true; want false")
	}
	p.buffered.Add(-60)
	if !p.reserveBuffer(100) {
		t.Fatal("reserveBuffer(100) of 100 after release = false; want true")
	}
}
