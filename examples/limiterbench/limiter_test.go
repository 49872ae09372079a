// Package limiterbench compares the cost of ratecord's request path with
// discordgo's built-in rate limiter, measured in one run.
package limiterbench

import (
	"net/http"
	"testing"
	"time"

	"github.com/bwmarrin/discordgo"

	"github.com/ratecord/ratecord"
)

func knownBucketHeaders() http.Header {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "1000000")
	h.Set("X-RateLimit-Remaining", "999999")
	h.Set("X-RateLimit-Reset-After", "0.001")
	h.Set("X-RateLimit-Bucket", "abcdef")
	return h
}

const messages = "https://discord.com/api/v10/channels/123456789012345678/messages"

// BenchmarkDiscordgoLimiter is discordgo's per-request limiter work:
// LockBucket before sending, Release with the response headers after.
func BenchmarkDiscordgoLimiter(b *testing.B) {
	rl := discordgo.NewRatelimiter()
	h := knownBucketHeaders()
	rl.LockBucket(messages).Release(h)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := rl.LockBucket(messages).Release(h); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

type staticTransport struct{ resp *http.Response }

func (s staticTransport) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, nil }

// BenchmarkRatecordRoundTrip is ratecord's whole request path with a base
// transport that does no I/O: key, claim, send, read the headers, update.
func BenchmarkRatecordRoundTrip(b *testing.B) {
	resp := &http.Response{StatusCode: 200, Header: knownBucketHeaders(), Body: http.NoBody}
	tr := ratecord.NewTransport(staticTransport{resp}, ratecord.WithGlobalLimit(100000, 10*time.Millisecond))
	defer tr.Close()
	req, _ := http.NewRequest("POST", messages, http.NoBody)
	req.Header.Set("Authorization", "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.secretsecretsecretsecretsecret")
	if _, err := tr.RoundTrip(req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := tr.RoundTrip(req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
