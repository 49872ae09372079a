package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// The proxies the tests start share this process: with GOGC set they
	// leave the garbage collector's settings alone (the value is Go's
	// default, which the runtime has already applied).
	// TestGCTunerRestores covers the tuner.
	if _, set := os.LookupEnv("GOGC"); !set {
		os.Setenv("GOGC", "100")
	}
	goleak.VerifyTestMain(m)
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
type syncBuffer struct {
	mu  sync.Mutex // guards buf
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestRun(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"help lists commands", []string{"-h"}, 0, "emulator", ""},
		{"no command", nil, 2, "", "Usage: ratecord"},
		{"unknown command", []string{"frobnicate"}, 2, "", `unknown command "frobnicate"`},
		{"emulator help", []string{"emulator", "-h"}, 0, "", "-time-scale"},
		{"bad flag", []string{"emulator", "-nope"}, 2, "", "flag provided but not defined: -nope"},
		{"extra argument", []string{"emulator", "extra"}, 2, "", "unexpected arguments"},
		{"bad time scale", []string{"emulator", "-time-scale", "0"}, 2, "", "must be positive"},
		{"not loopback", []string{"emulator", "-addr", "0.0.0.0:0"}, 1, "", "only loopback addresses are allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("run(%q) = %d; want %d (stderr %q)", tt.args, code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("run(%q) stdout = %q; want it to contain %q", tt.args, stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("run(%q) stderr = %q; want it to contain %q", tt.args, stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestEmulatorServesUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"emulator", "-addr", "127.0.0.1:0", "-tokens", "good, other", "-global", "1"}, &stdout, &stderr)
	}()

	urlRE := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)`)
	var url string
	deadline := time.Now().Add(10 * time.Second)
	for url == "" {
		if m := urlRE.FindStringSubmatch(stdout.String()); m != nil {
			url = m[1]
			break
		}
		select {
		case code := <-done:
			t.Fatalf("emulator exited with %d before listening: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("emulator did not print its URL: %q", stdout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(stdout.String(), url+"/api/v10") {
		t.Errorf("stdout = %q; want instructions with %s/api/v10", stdout.String(), url)
	}

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	get := func(auth string) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/api/v10/users/@me", nil)
		req.Header.Set("Authorization", auth)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	if resp := get("Bot good"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Bucket") == "" {
		t.Errorf("valid token: status %d bucket %q; want 200 with a bucket", resp.StatusCode, resp.Header.Get("X-RateLimit-Bucket"))
	}
	// -global 1: the second request within a second hits the global limit.
	if resp := get("Bot good"); resp.StatusCode != 429 || resp.Header.Get("X-RateLimit-Scope") != "global" {
		t.Errorf("second request: status %d scope %q; want 429 global", resp.StatusCode, resp.Header.Get("X-RateLimit-Scope"))
	}
	if resp := get("Bot unknown"); resp.StatusCode != 401 {
		t.Errorf("unknown token: status %d; want 401", resp.StatusCode)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Fatalf("emulator exited with %d: %s", code, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("emulator did not stop after cancel")
	}
	if !strings.Contains(stdout.String(), "Stopped after 3 requests") {
		t.Errorf("stdout = %q; want a summary of 3 requests", stdout.String())
	}
	if _, err := client.Get(url + "/api/v10/users/@me"); err == nil {
		t.Errorf("emulator still serving after it returned")
	}
}
