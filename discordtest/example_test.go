package discordtest_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// A bot that sends six messages to one channel, one every 10 ms, gets the
// sixth rejected: the default bucket allows five per five seconds. The fifth
// response said none remained, and the bot had time to read it, so the 429
// counts as avoidable.
func Example() {
	srv := discordtest.NewServer()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	for i := range 6 {
		if i > 0 {
			time.Sleep(10 * time.Millisecond) // the bot's own work between messages
		}
		req, err := http.NewRequest(http.MethodPost, srv.URL()+"/api/v10/channels/123/messages",
			strings.NewReader(`{"content":"hello"}`))
		if err != nil {
			panic(err)
		}
		req.Header.Set("Authorization", "Bot my-token")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		line := fmt.Sprintf("%d limit %s remaining %s", resp.StatusCode,
			resp.Header.Get("X-RateLimit-Limit"), resp.Header.Get("X-RateLimit-Remaining"))
		if scope := resp.Header.Get("X-RateLimit-Scope"); scope != "" {
			line += ", scope " + scope
		}
		fmt.Println(line)
	}

	st := srv.Stats()
	fmt.Printf("requests %d, 429s %d, avoidable %d\n", st.Requests, st.ByStatus[429], st.Avoidable)
	// Output:
	// 200 limit 5 remaining 4
	// 200 limit 5 remaining 3
	// 200 limit 5 remaining 2
	// 200 limit 5 remaining 1
	// 200 limit 5 remaining 0
	// 429 limit 5 remaining 0, scope user
	// requests 6, 429s 1, avoidable 1
}

// A large bot's emulator: GET /gateway/bot reports max_concurrency 16, and
// the global limit is the one that goes with it, 500 requests a second
// instead of 50.
func ExampleWithMaxConcurrency() {
	srv := discordtest.NewServer(discordtest.WithMaxConcurrency(16))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	req, err := http.NewRequest(http.MethodGet, srv.URL()+"/api/v10/gateway/bot", nil)
	if err != nil {
		panic(err)
	}
	req.Header.Set("Authorization", "Bot my-token")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var gw struct {
		Shards            int `json:"shards"`
		SessionStartLimit struct {
			MaxConcurrency int `json:"max_concurrency"`
		} `json:"session_start_limit"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&gw); err != nil {
		panic(err)
	}
	fmt.Printf("shards %d, max_concurrency %d, global limit %d/s\n",
		gw.Shards, gw.SessionStartLimit.MaxConcurrency, discordtest.GlobalLimitFor(gw.SessionStartLimit.MaxConcurrency))
	// Output:
	// shards 16, max_concurrency 16, global limit 500/s
}
