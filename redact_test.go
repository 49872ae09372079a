package ratecord_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratecord/ratecord"
)

const (
	redactWebhookToken     = "hA6cXzTUsyIEPl2rsoVnrm5bUgXvYbMzumVqpIsTGwQtb0ZD1Ow5IS8Q2-UEUyR8Y0Tp"
	redactInteractionToken = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDEyMzQ1Njc4OlNFQ1JFVHNlY3JldA"
)

// leaks returns the first 9-byte piece of secret found in s, or "".
func leaks(s, secret string) string {
	for i := 0; i+9 <= len(secret); i++ {
		if strings.Contains(s, secret[i:i+9]) {
			return secret[i : i+9]
		}
	}
	return ""
}

// emptyBucket serves a bucket with no request left for a minute.
func emptyBucket(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Bucket", "hook")
		w.Header().Set("X-RateLimit-Limit", "1")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset-After", "60")
		io.WriteString(w, `{"id":"1"}`)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestRedactErrorOfHTTPClient(t *testing.T) {
	t.Parallel()
	srv := emptyBucket(t)
	transport := ratecord.NewTransport(nil, ratecord.WithMaxWait(50*time.Millisecond))
	t.Cleanup(func() { transport.Close() })
	client := &http.Client{Transport: transport}
	for _, tok := range []string{redactWebhookToken, redactInteractionToken} {
		target := srv.URL + "/api/v10/webhooks/123456/" + tok + "?wait=true&thread_id=99"
		post := func() error {
			resp, err := client.Post(target, "application/json", strings.NewReader(`{"content":"hi"}`))
			if err == nil {
				resp.Body.Close()
			}
			return err
		}
		if err := post(); err != nil {
			t.Fatalf("first POST: %v", err)
		}
		err := post() // the bucket is empty for a minute: ratecord gives up
		if err == nil {
			t.Fatal("second POST succeeded; want a *RateLimitError")
		}
		if leaks(err.Error(), tok) == "" {
			t.Fatalf("http.Client's error %q does not quote the token; the test needs it to", err)
		}

		red := ratecord.RedactError(err)
		msg := red.Error()
		if piece := leaks(msg, tok); piece != "" {
			t.Errorf("RedactError(err).Error() = %q; holds %q of the token", msg, piece)
		}
		if strings.Contains(msg, "thread_id") || !strings.Contains(msg, "/api/v10/webhooks/123456/REDACTED\"") {
			t.Errorf("RedactError(err).Error() = %q; want the path redacted and no query", msg)
		}
		var rl *ratecord.RateLimitError
		if !errors.As(red, &rl) || rl.Route != "POST /webhooks/:id/:token" {
			t.Errorf("errors.As(RedactError(err), *RateLimitError) = %v, %+v; want the give-up", rl != nil, rl)
		}
		if !errors.Is(red, ratecord.ErrWaitTooLong) {
			t.Error("errors.Is(RedactError(err), ErrWaitTooLong) = false; want true")
		}
		ue, ok := red.(*url.Error)
		if !ok || ue.Op != "Post" || leaks(ue.URL, tok) != "" {
			t.Errorf("RedactError(err) = %#v; want a *url.Error with a redacted URL", red)
		}

		// Wrapped once more, the message is redacted all the same and
		// errors.As hands out only a redacted *url.Error.
		wrapped := ratecord.RedactError(fmt.Errorf("send to %s: %w", target, err))
		if piece := leaks(wrapped.Error(), tok); piece != "" || strings.Contains(wrapped.Error(), "thread_id") {
			t.Errorf("RedactError(wrapped) = %q; holds a piece of the token or the query", wrapped)
		}
		var wue *url.Error
		if !errors.As(wrapped, &wue) || leaks(wue.URL, tok) != "" || leaks(wue.Error(), tok) != "" {
			t.Errorf("errors.As(RedactError(wrapped), *url.Error) = %v; want a redacted copy", wue)
		}
		if !errors.As(wrapped, &rl) || !errors.Is(wrapped, ratecord.ErrWaitTooLong) || !errors.Is(wrapped, err) {
			t.Error("errors.As and errors.Is do not see through RedactError(wrapped)")
		}
	}
}

func TestRedactErrorOfNetworkError(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + l.Addr().String()
	l.Close()
	transport := ratecord.NewTransport(nil, ratecord.WithRetries(0))
	t.Cleanup(func() { transport.Close() })
	client := &http.Client{Transport: transport}
	_, err = client.Get(dead + "/api/v10/interactions/1/" + redactInteractionToken + "/callback")
	if err == nil {
		t.Fatal("GET to a closed port succeeded")
	}
	red := ratecord.RedactError(err)
	if piece := leaks(red.Error(), redactInteractionToken); piece != "" {
		t.Errorf("RedactError(%q) = %q; holds %q of the token", err, red, piece)
	}
	var op *net.OpError
	if !errors.As(red, &op) {
		t.Errorf("errors.As(RedactError(err), *net.OpError) = false; want the dial error")
	}
}

func TestRedactErrorText(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"", ""},
		{"no url here", "no url here"},
		{`Post "https://discord.com/api/v10/webhooks/1/` + redactWebhookToken + `?wait=true": EOF`,
			`Post "https://discord.com/api/v10/webhooks/1/REDACTED": EOF`},
		{"get https://user:pass@discord.com/api/v10/users/@me#frag, then gave up",
			"get https://discord.com/api/v10/users/@me, then gave up"},
		{"PATCH /api/v10/webhooks/1/shorttoken/messages/@original: 404",
			"PATCH /api/v10/webhooks/1/REDACTED/messages/@original: 404"},
		{"(url=HTTP://x/interactions/5/tok/callback?code=abc)", "(url=http://x/interactions/5/REDACTED/callback)"},
		{"ratecord: POST /webhooks/:id/:token: gave up (scope user): ratecord: wait exceeds the maximum",
			"ratecord: POST /webhooks/:id/:token: gave up (scope user): ratecord: wait exceeds the maximum"},
		{"a long segment /files/" + redactWebhookToken + ".", "a long segment /files/REDACTED."},
		{"bad escape /webhooks/1/%zz", "bad escape REDACTED"},
		{"no path a/b/webhooks/1/tok", "no path a/b/webhooks/1/tok"},
	}
	for _, tt := range tests {
		err := errors.New(tt.in)
		got := ratecord.RedactError(err)
		if got.Error() != tt.want {
			t.Errorf("RedactError(%q) = %q; want %q", tt.in, got, tt.want)
		}
		if tt.in == tt.want && got != err {
			t.Errorf("RedactError(%q) = %#v; want the error itself", tt.in, got)
		}
		if !errors.Is(got, err) {
			t.Errorf("errors.Is(RedactError(%q), err) = false", tt.in)
		}
	}
	if ratecord.RedactError(nil) != nil {
		t.Error("RedactError(nil) != nil")
	}
	plain := &url.Error{Op: "Get", URL: "https://discord.com/api/v10/users/@me", Err: io.EOF}
	if got := ratecord.RedactError(plain); got != plain {
		t.Errorf("RedactError(%v) = %v; want the same *url.Error", plain, got)
	}
}

// A webhook's token is in its URL, and http.Client quotes the URL in every
// error it returns, ratecord's included. RedactError removes it and keeps
// the error's chain.
func ExampleRedactError() {
	discord := discordLike() // 2 requests per 10 seconds
	defer discord.Close()
	transport := ratecord.NewTransport(nil, ratecord.WithMaxWait(time.Second))
	defer transport.Close()
	client := &http.Client{Transport: transport}

	hook := discord.URL + "/api/v10/webhooks/123/my-webhook-token?wait=true"
	var err error
	for i := 0; i < 3 && err == nil; i++ {
		var resp *http.Response
		resp, err = client.Post(hook, "application/json", strings.NewReader(`{"content":"hi"}`))
		if err == nil {
			resp.Body.Close()
		}
	}
	fmt.Println("raw error quotes the token:", strings.Contains(err.Error(), "my-webhook-token"))

	err = ratecord.RedactError(err)
	fmt.Println("redacted error quotes the token:", strings.Contains(err.Error(), "my-webhook-token"))
	var ue *url.Error
	if errors.As(err, &ue) {
		fmt.Println("URL:", strings.TrimPrefix(ue.URL, discord.URL))
	}
	var rl *ratecord.RateLimitError
	if errors.As(err, &rl) {
		fmt.Println("gave up on", rl.Route, errors.Is(err, ratecord.ErrWaitTooLong))
	}
	// Output:
	// raw error quotes the token: true
	// redacted error quotes the token: false
	// URL: /api/v10/webhooks/123/REDACTED
	// gave up on POST /webhooks/:id/:token true
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, want string
	}{
		{"plain", "https://discord.com/api/v10/channels/123/messages", "https://discord.com/api/v10/channels/123/messages"},
		{"query", "https://discord.com/api/v10/webhooks/1/tok?wait=true", "https://discord.com/api/v10/webhooks/1/REDACTED?wait=true"},
		{"webhook message", "https://discord.com/api/webhooks/1/tok/messages/@original", "https://discord.com/api/webhooks/1/REDACTED/messages/@original"},
		{"interaction", "https://discord.com/api/v10/interactions/9/aW50ZXJhY3Rpb246abc/callback", "https://discord.com/api/v10/interactions/9/REDACTED/callback"},
		{"long segment", "https://discord.com/api/v10/x/" + "0123456789012345678901234567890123456789", "https://discord.com/api/v10/x/REDACTED"},
		{"webhook without token", "https://discord.com/api/v10/webhooks/1", "https://discord.com/api/v10/webhooks/1"},
		{"userinfo and fragment", "https://user:pass@discord.com/api/v10/users/@me#frag", "https://discord.com/api/v10/users/@me"},
		{"port", "http://127.0.0.1:8089/api/v10/webhooks/1/tok", "http://127.0.0.1:8089/api/v10/webhooks/1/REDACTED"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			u, err := url.Parse(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if got := ratecord.RedactURL(u); got != tc.want {
				t.Errorf("RedactURL(%q) = %q; want %q", tc.in, got, tc.want)
			}
		})
	}
	if got := ratecord.RedactURL(nil); got != "" {
		t.Errorf("ratecord.RedactURL(nil) = %q; want \"\"", got)
	}
}
