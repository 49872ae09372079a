// Package nethttp_test's example sends a burst of messages through a plain
// http.Client with ratecord as its transport, against the Discord emulator.
package nethttp_test

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
)

// Eight messages sent at once to one channel whose bucket allows five per
// window all arrive: ratecord holds back the last three until the window
// has room, where a client without it gets 429s (see the discordtest
// example). The emulator runs ten times faster than Discord.
func Example() {
	srv := discordtest.NewServer(discordtest.WithTimeScale(0.1))
	defer srv.Close()

	transport := ratecord.NewTransport(nil)
	defer transport.Close()
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	var (
		mu       sync.Mutex // guards statuses
		statuses = make(map[int]int)
		wg       sync.WaitGroup
	)
	for i := range 8 {
		wg.Go(func() {
			req, err := http.NewRequest(http.MethodPost, srv.URL()+"/api/v10/channels/123/messages",
				strings.NewReader(fmt.Sprintf(`{"content":"message %d"}`, i)))
			if err != nil {
				panic(err)
			}
			req.Header.Set("Authorization", "Bot my-token")
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				fmt.Println(ratecord.RedactError(err)) // never the error itself: a webhook's token is in its URL
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			statuses[resp.StatusCode]++
			mu.Unlock()
		})
	}
	wg.Wait()

	st := srv.Stats()
	fmt.Printf("client saw %d OK; emulator answered %d requests, 429s %d\n",
		statuses[http.StatusOK], st.Requests, st.ByStatus[http.StatusTooManyRequests])
	// Output:
	// client saw 8 OK; emulator answered 8 requests, 429s 0
}
