package ratecord_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/ratecord/ratecord"
)

// staticTransport answers every request with the same response and does no
// I/O, so a benchmark measures ratecord alone.
type staticTransport struct{ resp *http.Response }

func (s staticTransport) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, nil }

// BenchmarkRoundTrip measures a request on a known bucket with slots to
// spare: key, claim, send (no I/O), read the headers, update.
func BenchmarkRoundTrip(b *testing.B) {
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
	resp.Header.Set("X-RateLimit-Limit", "1000000")
	resp.Header.Set("X-RateLimit-Remaining", "999999")
	resp.Header.Set("X-RateLimit-Reset-After", "0.001")
	resp.Header.Set("X-RateLimit-Bucket", "abcdef")
	// A global budget wide enough never to bind: this measures the path,
	// not the waiting.
	tr := ratecord.NewTransport(staticTransport{resp}, ratecord.WithGlobalLimit(100000, 10*time.Millisecond))
	defer tr.Close()
	req, _ := http.NewRequest("POST", "https://discord.com/api/v10/channels/123456789012345678/messages", http.NoBody)
	req.Header.Set("Authorization", "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.secretsecretsecretsecretsecret")
	if _, err := tr.RoundTrip(req); err != nil { // learn the bucket
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
