package discordtest_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/ratecord/ratecord/discordtest"
)

// A bot that sends six messages at once to one channel gets the sixth
// rejected: the default bucket allows five per five seconds.
func Example() {
	srv := discordtest.NewServer()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()

	for range 6 {
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
