package ratecord_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratecord/ratecord"
)

// staticTransport answers every request with the same response and does no
// I/O, so a benchmark measures ratecord alone.
type staticTransport struct{ resp *http.Response }

func (s staticTransport) RoundTrip(*http.Request) (*http.Response, error) { return s.resp, nil }

// freshTransport is a staticTransport that returns a copy of its response
// each time, as a real transport returns a response of its own: the
// Transport wraps the body of a response whose request's context can end.
type freshTransport struct{ resp *http.Response }

func (s freshTransport) RoundTrip(*http.Request) (*http.Response, error) {
	r := *s.resp
	return &r, nil
}

// BenchmarkRoundTrip measures a request on a known bucket with slots to
// spare: key, claim, send (no I/O), read the headers, update. Telemetry is
// off: the global OpenTelemetry providers are the default no-ops.
func BenchmarkRoundTrip(b *testing.B) {
	benchRoundTrip(b)
}

// BenchmarkRoundTripDeadline is BenchmarkRoundTrip for requests whose
// context can end (a deadline, a cancel), as most callers' can: such a
// request is handed to the base transport from a goroutine of its own,
// so that a caller who leaves after the write is released at once while
// its response is still read (see [ratecord.Transport.RoundTrip]).
func BenchmarkRoundTripDeadline(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchRoundTripContext(b, ctx)
}

// BenchmarkRoundTripTelemetry is BenchmarkRoundTrip with telemetry on: an
// SDK tracer provider sampling every span into a batch processor whose
// exporter discards them, and an SDK meter provider with a manual reader.
func BenchmarkRoundTripTelemetry(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	defer tp.Shutdown(context.Background())
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer mp.Shutdown(context.Background())
	benchRoundTrip(b, ratecord.WithTracerProvider(tp), ratecord.WithMeterProvider(mp))
}

// discardExporter is a span exporter that drops everything.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

func benchRoundTrip(b *testing.B, opts ...ratecord.Option) {
	benchRoundTripContext(b, context.Background(), opts...)
}

// benchRoundTripContext runs the benchmark with requests of ctx: through
// a staticTransport for a context that never ends, a freshTransport
// otherwise.
func benchRoundTripContext(b *testing.B, ctx context.Context, opts ...ratecord.Option) {
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
	resp.Header.Set("X-RateLimit-Limit", "1000000")
	resp.Header.Set("X-RateLimit-Remaining", "999999")
	resp.Header.Set("X-RateLimit-Reset-After", "0.001")
	resp.Header.Set("X-RateLimit-Bucket", "abcdef")
	// A global budget wide enough never to bind: this measures the path,
	// not the waiting.
	opts = append([]ratecord.Option{ratecord.WithGlobalLimit(100000, 10*time.Millisecond)}, opts...)
	var base http.RoundTripper = staticTransport{resp}
	if ctx.Done() != nil {
		base = freshTransport{resp}
	}
	tr := ratecord.NewTransport(base, opts...)
	defer tr.Close()
	req, _ := http.NewRequestWithContext(ctx, "POST", "https://discord.com/api/v10/channels/123456789012345678/messages", http.NoBody)
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
