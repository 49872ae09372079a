package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startEmulator runs "ratecord emulator" with args on a free port until t
// ends and returns its URL and what it prints.
func startEmulator(t *testing.T, args ...string) (string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, append([]string{"emulator", "-addr", "127.0.0.1:0"}, args...), &stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("emulator exited with %d: %s", code, stderr.String())
			}
		case <-time.After(10 * time.Second):
			t.Error("emulator did not stop after cancel")
		}
	})
	urlRE := regexp.MustCompile(`listening on (http://127\.0\.0\.1:\d+)`)
	for deadline := time.Now().Add(10 * time.Second); ; {
		if m := urlRE.FindStringSubmatch(stdout.String()); m != nil {
			return m[1], &stdout
		}
		select {
		case code := <-done:
			done <- code // for the cleanup
			t.Fatalf("emulator exited with %d before listening: %s", code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("emulator did not print its URL: %q", stdout.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEmulatorMaxConcurrency checks that -max-concurrency is what GET
// /gateway/bot reports and sets the global limit that goes with it unless
// -global is given. -time-scale 100 makes the global second last 100 s, so
// every request below falls in one window however slow the machine.
func TestEmulatorMaxConcurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		args       []string
		wantMax    int
		wantGlobal int
	}{
		{"default", nil, 1, 50},
		{"sixteen", []string{"-max-concurrency", "16"}, 16, 500},
		{"thirty-two", []string{"-max-concurrency", "32"}, 32, 800},
		{"-global wins", []string{"-max-concurrency", "16", "-global", "50"}, 16, 50},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url, stdout := startEmulator(t, append([]string{"-time-scale", "100"}, tt.args...)...)
			if want := "Global limit " + strconv.Itoa(tt.wantGlobal) + " requests/s"; !strings.Contains(stdout.String(), want) {
				t.Errorf("stdout = %q; want it to contain %q", stdout.String(), want)
			}
			tr := &http.Transport{}
			t.Cleanup(tr.CloseIdleConnections)
			client := &http.Client{Transport: tr}
			get := func(path string) (*http.Response, []byte) {
				t.Helper()
				req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, url+path, nil)
				req.Header.Set("Authorization", "Bot emulator-test")
				resp, err := client.Do(req)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				defer resp.Body.Close()
				body, err := io.ReadAll(resp.Body)
				if err != nil {
					t.Fatalf("GET %s: reading body: %v", path, err)
				}
				return resp, body
			}

			resp, body := get("/api/v10/gateway/bot")
			var gw struct {
				SessionStartLimit struct {
					MaxConcurrency int `json:"max_concurrency"`
				} `json:"session_start_limit"`
			}
			if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &gw) != nil || gw.SessionStartLimit.MaxConcurrency != tt.wantMax {
				t.Fatalf("GET /gateway/bot = %d %s; want 200 with max_concurrency %d", resp.StatusCode, body, tt.wantMax)
			}
			for i := 1; i < tt.wantGlobal; i++ {
				if resp, body := get("/api/v10/gateway"); resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d of a global limit of %d: %d %s; want 200", i+1, tt.wantGlobal, resp.StatusCode, body)
				}
			}
			if resp, _ := get("/api/v10/gateway"); resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("X-RateLimit-Scope") != "global" {
				t.Errorf("request %d of a global limit of %d: status %d scope %q; want 429 global",
					tt.wantGlobal+1, tt.wantGlobal, resp.StatusCode, resp.Header.Get("X-RateLimit-Scope"))
			}
		})
	}
}

func TestEmulatorMaxConcurrencyUsage(t *testing.T) {
	t.Parallel()
	var stdout, stderr syncBuffer
	if code := run(t.Context(), []string{"emulator", "-max-concurrency", "0"}, &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "-max-concurrency 0 must be at least 1") {
		t.Errorf("run(emulator -max-concurrency 0) = %d, stderr %q; want 2 and a usage error", code, stderr.String())
	}
}
