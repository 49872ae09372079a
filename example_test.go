package ratecord_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/store/memstore"
)

// discordLike serves one bucket of 2 requests per 10 seconds, announced in
// headers the way Discord does.
func discordLike() *httptest.Server {
	var used atomic.Int32
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := used.Add(1)
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		w.Header().Set("X-RateLimit-Limit", "2")
		w.Header().Set("X-RateLimit-Remaining", fmt.Sprint(max(0, 2-n)))
		w.Header().Set("X-RateLimit-Reset-After", "10.000")
		fmt.Fprint(w, `{"id":"1"}`)
	}))
}

// The transport is a drop-in http.RoundTripper: every request made through
// the client waits for its turn.
func Example() {
	discord := discordLike()
	defer discord.Close()

	transport := ratecord.NewTransport(nil)
	defer transport.Close()
	client := &http.Client{Transport: transport}

	for i := 0; i < 2; i++ {
		req, _ := http.NewRequest("POST", discord.URL+"/api/v10/channels/123/messages", strings.NewReader(`{"content":"hi"}`))
		req.Header.Set("Authorization", "Bot my-token")
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	// Output:
	// 200 OK
	// 200 OK
}

// A request that would have to wait past its deadline fails at once with a
// *RateLimitError, which also matches context.DeadlineExceeded.
func ExampleRateLimitError() {
	discord := discordLike()
	defer discord.Close()
	transport := ratecord.NewTransport(nil)
	defer transport.Close()
	client := &http.Client{Transport: transport}

	send := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "POST", discord.URL+"/api/v10/channels/123/messages", nil)
		req.Header.Set("Authorization", "Bot my-token")
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	send(context.Background())
	send(context.Background()) // the bucket is now empty for ten seconds

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := send(ctx)
	var rl *ratecord.RateLimitError
	if errors.As(err, &rl) {
		fmt.Println(rl.Route, rl.Bucket, rl.Scope, rl.RetryAfter > 9*time.Second)
	}
	fmt.Println(errors.Is(err, context.DeadlineExceeded))
	// Output:
	// POST /channels/:id/messages abcd user true
	// true
}

// Transports can share one store, so they share the limits.
func ExampleWithStore() {
	store := memstore.New()
	defer store.Close()
	a := ratecord.NewTransport(nil, ratecord.WithStore(store))
	b := ratecord.NewTransport(nil, ratecord.WithStore(store), ratecord.WithMaxWait(30*time.Second))
	defer a.Close()
	defer b.Close()
	fmt.Println(a != b)
	// Output: true
}

// A large bot, whose global limit Discord raised, shares a transport (and
// so a store) with bots on the default limit. The bot is named by its user
// id, which the first segment of its token encodes, never by its token.
// Here the default is one request an hour, and bot 123456789012345678 may
// send three.
func ExampleWithBotGlobalLimit() {
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{}`)
	}))
	defer discord.Close()
	transport := ratecord.NewTransport(nil,
		ratecord.WithGlobalLimit(1, time.Hour),
		ratecord.WithBotGlobalLimit("123456789012345678", 3),
		ratecord.WithMaxWait(time.Second))
	defer transport.Close()
	client := &http.Client{Transport: transport}

	send := func(bot string) {
		req, _ := http.NewRequest("GET", discord.URL+"/api/v10/users/@me", nil)
		token := base64.RawStdEncoding.EncodeToString([]byte(bot)) + ".GhIjKl.not-a-real-token"
		req.Header.Set("Authorization", "Bot "+token)
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(bot, errors.Is(err, ratecord.ErrWaitTooLong))
			return
		}
		resp.Body.Close()
		fmt.Println(bot, resp.Status)
	}
	for range 3 {
		send("123456789012345678")
	}
	send("876543210987654321")
	send("876543210987654321")
	// Output:
	// 123456789012345678 200 OK
	// 123456789012345678 200 OK
	// 123456789012345678 200 OK
	// 876543210987654321 200 OK
	// 876543210987654321 true
}

// A slash-command reply that must go now or not at all: under a context
// from WithRequestMaxWait(ctx, 0) a request whose bucket is spent fails at
// once, saying how long it would have waited, instead of waiting.
func ExampleWithRequestMaxWait() {
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		w.Header().Set("X-RateLimit-Limit", "1")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset-After", "5")
		fmt.Fprint(w, `{}`)
	}))
	defer discord.Close()
	transport := ratecord.NewTransport(nil)
	defer transport.Close()
	client := &http.Client{Transport: transport}

	send := func(ctx context.Context) {
		req, _ := http.NewRequestWithContext(ctx, "POST", discord.URL+"/api/v10/channels/1/messages", nil)
		req.Header.Set("Authorization", "Bot token")
		resp, err := client.Do(req)
		var rl *ratecord.RateLimitError
		if errors.As(err, &rl) {
			fmt.Println(errors.Is(err, ratecord.ErrWaitTooLong), rl.RetryAfter.Round(time.Second))
			return
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	send(context.Background())
	send(ratecord.WithRequestMaxWait(context.Background(), 0))
	// Output:
	// 200 OK
	// true 5s
}

// A large bot need not know its global limit: with detection on, its first
// request makes the transport ask Discord for the bot's gateway, whose
// max_concurrency gives the limit. Here the emulator plays a bot with a
// max_concurrency of 16, whose limit is 500 requests a second.
func ExampleWithGlobalLimitDetection() {
	discord := discordtest.NewServer(discordtest.WithMaxConcurrency(16))
	defer discord.Close()
	transport := ratecord.NewTransport(nil, ratecord.WithGlobalLimitDetection(true))
	defer transport.Close()
	client := &http.Client{Transport: transport}

	const botID = "123456789012345678"
	req, _ := http.NewRequest("GET", discord.URL()+"/api/v10/users/@me", nil)
	req.Header.Set("Authorization", "Bot "+base64.RawStdEncoding.EncodeToString([]byte(botID))+".GhIjKl.not-a-real-token")
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	for range 500 { // the detection runs beside the request
		if transport.DetectedGlobalLimit(botID) != 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Println(transport.DetectedGlobalLimit(botID))
	// Output: 500
}

// A job system asks when a request could go and schedules the job then,
// instead of parking a worker on it: readyAt = now + Estimate. Here the
// first job spends the channel's bucket, whose reset is 2 s away, so the
// second is deferred by about that long.
func ExampleTransport_Estimate() {
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		w.Header().Set("X-RateLimit-Limit", "1")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset-After", "2")
		fmt.Fprint(w, `{}`)
	}))
	defer discord.Close()
	transport := ratecord.NewTransport(nil)
	defer transport.Close()
	client := &http.Client{Transport: transport}

	for job := 1; job <= 2; job++ {
		req, _ := http.NewRequest("POST", discord.URL+"/api/v10/channels/1/messages", nil)
		req.Header.Set("Authorization", "Bot token")
		wait, err := transport.Estimate(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		if wait > 0 {
			fmt.Printf("job %d deferred by about %v\n", job, wait.Round(time.Second))
			continue // a real queue would schedule it at time.Now().Add(wait)
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("job %d sent: %s\n", job, resp.Status)
	}
	// Output:
	// job 1 sent: 200 OK
	// job 2 deferred by about 2s
}

// A slash-command reply marked urgent goes ahead of bulk messages already
// waiting for the same channel's bucket (one message per 200 ms here).
func ExampleWithRequestPriority() {
	var mu sync.Mutex
	var seen []string
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("X-Job"))
		mu.Unlock()
		w.Header().Set("X-RateLimit-Bucket", "abcd")
		w.Header().Set("X-RateLimit-Limit", "1")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset-After", "0.2")
		fmt.Fprint(w, `{}`)
	}))
	defer discord.Close()
	transport := ratecord.NewTransport(nil)
	defer transport.Close()
	client := &http.Client{Transport: transport}
	send := func(ctx context.Context, job string) {
		req, _ := http.NewRequestWithContext(ctx, "POST", discord.URL+"/api/v10/channels/1/messages", nil)
		req.Header.Set("Authorization", "Bot token")
		req.Header.Set("X-Job", job)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}

	send(context.Background(), "first") // learns the bucket, and spends it
	var wg sync.WaitGroup
	for _, job := range []string{"bulk 1", "bulk 2", "reply"} {
		ctx := context.Background()
		if job == "reply" {
			ctx = ratecord.WithRequestPriority(ctx, ratecord.PriorityUrgent)
		}
		wg.Go(func() { send(ctx, job) })
		time.Sleep(50 * time.Millisecond) // they arrive in this order
	}
	wg.Wait()
	fmt.Println(strings.Join(seen, ", "))
	// Output: first, reply, bulk 1, bulk 2
}

// Events tell when Discord answered 429, when ratecord retries, gives up, or
// refuses a request to protect the bot from a ban.
func ExampleWithEventHandler() {
	var calls atomic.Int32
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("X-RateLimit-Scope", "user")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"message":"You are being rate limited.","retry_after":0.05,"global":false}`)
			return
		}
		fmt.Fprint(w, `{}`)
	}))
	defer discord.Close()

	transport := ratecord.NewTransport(nil, ratecord.WithEventHandler(func(e ratecord.Event) {
		fmt.Println(e.Kind, e.Route, e.Scope, e.RetryAfter)
	}))
	defer transport.Close()
	resp, err := (&http.Client{Transport: transport}).Get(discord.URL + "/api/v10/channels/123/pins")
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.Status)
	// Output:
	// rate_limited GET /channels/:id/pins user 50ms
	// retrying GET /channels/:id/pins user 50ms
	// 200 OK
}

// Reactions go one at a time per channel, a quarter second apart by
// default, as Discord states, while their headers claim a long window
// (headers of a window of a second or less are taken at their word);
// WithReactionSpacing changes the spacing.
func ExampleWithReactionSpacing() {
	var mu sync.Mutex
	var last time.Time
	var gaps []time.Duration
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if !last.IsZero() {
			gaps = append(gaps, time.Since(last))
		}
		last = time.Now()
		mu.Unlock()
		w.Header().Set("X-RateLimit-Bucket", "react")
		// Headers claiming a long window, as reaction routes have been
		// seen to while Discord allowed far less.
		w.Header().Set("X-RateLimit-Limit", "200")
		w.Header().Set("X-RateLimit-Remaining", "199")
		w.Header().Set("X-RateLimit-Reset-After", "600")
		w.WriteHeader(http.StatusNoContent)
	}))
	defer discord.Close()

	transport := ratecord.NewTransport(nil, ratecord.WithReactionSpacing(100*time.Millisecond))
	defer transport.Close()
	client := &http.Client{Transport: transport}

	var wg sync.WaitGroup
	for _, emoji := range []string{"%F0%9F%91%8D", "%F0%9F%8E%89", "%F0%9F%9A%80"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("PUT", discord.URL+"/api/v10/channels/123/messages/456/reactions/"+emoji+"/@me", nil)
			req.Header.Set("Authorization", "Bot my-token")
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	for _, g := range gaps {
		fmt.Println(g >= 100*time.Millisecond)
	}
	// Output:
	// true
	// true
}

// A Cloudflare block holds its route for every credential: after the
// block, the next request waits out the pause, then goes as the probe.
func ExampleWithBlockPause() {
	var blocked atomic.Bool
	discord := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if blocked.CompareAndSwap(false, true) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, "error code: 1015")
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	defer discord.Close()

	transport := ratecord.NewTransport(nil, ratecord.WithBlockPause(time.Second, time.Minute), ratecord.WithRetries(0))
	defer transport.Close()
	client := &http.Client{Transport: transport}

	get := func(token string) {
		req, _ := http.NewRequest(http.MethodGet, discord.URL+"/api/v10/users/@me", nil)
		req.Header.Set("Authorization", "Bot "+token)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Printf("%d after %.0f s\n", resp.StatusCode, time.Since(start).Round(time.Second).Seconds())
	}
	get("first-bot-token")  // the block itself, returned as it came: no retries
	get("second-bot-token") // another bot: the ban is per IP, so it waits too
	// Output:
	// 429 after 0 s
	// 200 after 1 s
}
