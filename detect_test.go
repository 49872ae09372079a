package ratecord_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
)

// TestGlobalLimitDetection runs a bot whose gateway reports a
// max_concurrency of 16 (a global limit of 500/s) against the emulator: once
// detected, 200 requests in a row go at once, where the default 50/s would
// refuse the 51st of a transport that will not wait.
func TestGlobalLimitDetection(t *testing.T) {
	t.Parallel()
	srv := discordtest.NewServer(discordtest.WithMaxConcurrency(16))
	t.Cleanup(srv.Close)
	const id = "123456789012345678"
	auth := "Bot " + base64.RawStdEncoding.EncodeToString([]byte(id)) + ".GhIjKl.emulated-token-signature"
	tr := ratecord.NewTransport(nil, ratecord.WithGlobalLimitDetection(true))
	t.Cleanup(func() { tr.Close() })
	c := &http.Client{Transport: tr}
	send := func(ctx context.Context, path string) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL()+"/api/v10"+path, nil)
		req.Header.Set("Authorization", auth)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	if err := send(context.Background(), "/users/@me"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tr.DetectedGlobalLimit(id) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no global limit detected within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := tr.DetectedGlobalLimit(id); got != 500 {
		t.Fatalf("DetectedGlobalLimit = %d; want 500", got)
	}
	nowait := ratecord.WithRequestMaxWait(context.Background(), 0)
	for i := range 200 {
		if err := send(nowait, fmt.Sprintf("/channels/%d", 1000+i)); err != nil {
			t.Fatalf("request %d of a bot with a 500/s limit: %v", i, err)
		}
	}
	st := srv.Stats()
	if st.ByStatus[429] != 0 || st.Invalid != 0 {
		t.Errorf("emulator: %d 429s, %d invalid requests; want none", st.ByStatus[429], st.Invalid)
	}
}

// TestGlobalLimitDetectionFailure checks that a gateway that answers 401 is
// asked once, not again on every request, and leaves the default limit.
func TestGlobalLimitDetectionFailure(t *testing.T) {
	t.Parallel()
	mock := httpmock.NewMockTransport()
	mock.RegisterResponder("GET", "=~/gateway/bot$", httpmock.NewStringResponder(401, `{"message":"401: Unauthorized","code":0}`))
	mock.RegisterRegexpResponder("GET", channelRE, httpmock.NewStringResponder(200, `{}`))
	const id = "123456789012345678"
	auth := "Bot " + base64.RawStdEncoding.EncodeToString([]byte(id)) + ".GhIjKl.emulated-token-signature"
	c, tr := newClient(t, mock, ratecord.WithGlobalLimitDetection(true), ratecord.WithCooldown(-1))
	for i := range 20 {
		okResp(t)(do(t, c, "GET", fmt.Sprintf("%s/channels/%d", api, i), auth))
	}
	deadline := time.Now().Add(5 * time.Second)
	for mock.GetCallCountInfo()["GET =~/gateway/bot$"] == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	for i := range 20 {
		okResp(t)(do(t, c, "GET", fmt.Sprintf("%s/channels/%d", api, 100+i), auth))
	}
	if n := mock.GetCallCountInfo()["GET =~/gateway/bot$"]; n != 1 {
		t.Errorf("GET /gateway/bot sent %d times; want once", n)
	}
	if got := tr.DetectedGlobalLimit(id); got != 0 {
		t.Errorf("DetectedGlobalLimit after a 401 = %d; want 0", got)
	}
}

// TestEstimateAgainstEmulator spends a channel's message bucket on the
// emulator and checks that Estimate then says to wait about until its
// reset, without taking a slot, while another channel may go at once.
func TestEstimateAgainstEmulator(t *testing.T) {
	t.Parallel()
	srv := discordtest.NewServer()
	t.Cleanup(srv.Close)
	tr := ratecord.NewTransport(nil)
	t.Cleanup(func() { tr.Close() })
	c := &http.Client{Transport: tr}
	newReq := func(channel int) *http.Request {
		req, _ := http.NewRequest("POST", fmt.Sprintf("%s/api/v10/channels/%d/messages", srv.URL(), channel), nil)
		req.Header.Set("Authorization", "Bot estimate-test-token")
		return req
	}
	sent := 0
	for {
		d, err := tr.Estimate(newReq(1))
		if err != nil {
			t.Fatalf("Estimate: %v", err)
		}
		if d > 0 {
			if d > 10*time.Second {
				t.Errorf("Estimate on a spent bucket = %v; want at most its window", d)
			}
			break
		}
		if sent++; sent > 20 {
			t.Fatal("20 messages sent and Estimate still says 0")
		}
		resp, err := c.Do(newReq(1))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if d, err := tr.Estimate(newReq(2)); err != nil || d != 0 {
		t.Errorf("Estimate on another channel = %v, %v; want 0", d, err)
	}
	if st := srv.Stats(); st.ByStatus[429] != 0 {
		t.Errorf("%d 429s; want none", st.ByStatus[429])
	}
}
