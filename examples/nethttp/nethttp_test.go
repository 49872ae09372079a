// Package nethttp_test shows ratecord with nothing but net/http: an
// http.Client whose transport is a ratecord Transport sends concurrent
// messages to one channel, where they queue for the channel's bucket, and
// fans messages out over many channels, where the global limit of 50
// requests per second per bot is what holds them back. Against the Discord
// emulator (discordtest) every message is delivered and none gets a 429.
package nethttp_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const token = "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.examples-nethttp-token"

// newClient returns an http.Client sending through a new ratecord
// Transport, both closed when t ends.
func newClient(t *testing.T) *http.Client {
	t.Helper()
	tr := ratecord.NewTransport(nil)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })
	return &http.Client{Transport: tr}
}

// post sends a message with content to channel and fails t unless it was
// created.
func post(t *testing.T, client *http.Client, base, channel, content string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, base+"/api/v10/channels/"+channel+"/messages",
		strings.NewReader(fmt.Sprintf(`{"content":%q}`, content)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("POST to channel %s: %v", channel, ratecord.RedactError(err))
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(body), fmt.Sprintf(`"content":%q`, content)) {
		t.Errorf("POST to channel %s = %s %s (read error %v); want 200 with the new message", channel, resp.Status, body, err)
	}
}

// checkDelivered fails t unless the emulator answered no 429 and delivered
// want messages to each of channels.
func checkDelivered(t *testing.T, srv *discordtest.Server, channels []string, want int) {
	t.Helper()
	st := srv.Stats()
	if st.ByStatus[http.StatusTooManyRequests] != 0 || st.Avoidable != 0 {
		t.Errorf("emulator answered %d 429s (by scope %v, %d avoidable); want none",
			st.ByStatus[http.StatusTooManyRequests], st.ByScope, st.Avoidable)
	}
	delivered := make(map[string]int)
	for k, n := range st.Successes {
		delivered[k.Major] += n
	}
	for _, c := range channels {
		if got := delivered["channels/"+c]; got != want {
			t.Errorf("emulator delivered %d messages to channel %s; want %d", got, c, want)
		}
	}
}

// TestOneChannel posts 20 messages to one channel at once. The emulator
// runs every window ten times shorter, so the bucket allows 5 messages per
// 0.5 s: ratecord sends the first five together and the others as the
// window slides.
func TestOneChannel(t *testing.T) {
	srv := discordtest.NewServer(discordtest.WithTimeScale(0.1))
	t.Cleanup(srv.Close)
	client := newClient(t)

	const n = 20
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { post(t, client, srv.URL(), "200000000000000001", fmt.Sprintf("message %d", i)) })
	}
	wg.Wait()
	checkDelivered(t, srv, []string{"200000000000000001"}, n)
}

// TestFanOut posts 4 messages to each of 20 channels at once: 80 requests,
// each bucket inside its limit (5 per 5 s), but more than the global limit
// of 50 per second allows. The emulator runs in real time here, so its
// global limit is Discord's and ratecord's default: the last 30 requests
// wait for the global window, and the test takes over a second.
func TestFanOut(t *testing.T) {
	srv := discordtest.NewServer()
	t.Cleanup(srv.Close)
	client := newClient(t)

	const perChannel = 4
	channels := make([]string, 20)
	for i := range channels {
		channels[i] = fmt.Sprintf("2100000000000000%02d", i)
	}
	var wg sync.WaitGroup
	for _, c := range channels {
		for i := range perChannel {
			wg.Go(func() { post(t, client, srv.URL(), c, fmt.Sprintf("message %d", i)) })
		}
	}
	wg.Wait()
	checkDelivered(t, srv, channels, perChannel)
}
