// Package otelbench compares what ratecord's telemetry adds to a request
// with what otelhttp adds to one, under the same OpenTelemetry SDK set-up
// and in one run.
//
// Every benchmark sends through the same base transport, which does no
// I/O. The cost ratecord's telemetry adds is BenchmarkRatecordTelemetry
// less BenchmarkRatecord; the cost otelhttp adds is BenchmarkOtelhttp less
// BenchmarkBase.
package otelbench

import (
	"context"
	"net/http"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ratecord/ratecord"
)

const messages = "https://discord.com/api/v10/channels/123456789012345678/messages"

// base answers every request with a new 200 carrying a known bucket's
// headers, and does no I/O. The response is new each time because otelhttp
// replaces its body.
type base struct{ header http.Header }

func newBase() *base {
	h := http.Header{}
	h.Set("X-RateLimit-Limit", "1000000")
	h.Set("X-RateLimit-Remaining", "999999")
	h.Set("X-RateLimit-Reset-After", "0.001")
	h.Set("X-RateLimit-Bucket", "abcdef")
	return &base{header: h}
}

func (b *base) RoundTrip(req *http.Request) (*http.Response, error) {
	return &http.Response{StatusCode: http.StatusOK, Header: b.header, Body: http.NoBody, Request: req}, nil
}

// sdk returns an SDK tracer provider sampling every span into a batch
// processor whose exporter discards them, and an SDK meter provider with a
// manual reader: the set-up of the root package's
// BenchmarkRoundTripTelemetry.
func sdk(b *testing.B) (*sdktrace.TracerProvider, *sdkmetric.MeterProvider) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	return tp, mp
}

// discardExporter is a span exporter that drops everything.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// run sends the same request through rt from every core, closing each
// response body (otelhttp ends its span there).
func run(b *testing.B, rt http.RoundTripper) {
	req, _ := http.NewRequest("POST", messages, http.NoBody)
	req.Header.Set("Authorization", "Bot MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.secretsecretsecretsecretsecret")
	send := func() error {
		resp, err := rt.RoundTrip(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}
	if err := send(); err != nil { // learn the bucket
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := send(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// ratecordTransport returns a transport over a new base whose global
// budget is wide enough never to bind: the benchmarks measure the path,
// not the waiting.
func ratecordTransport(b *testing.B, opts ...ratecord.Option) *ratecord.Transport {
	opts = append([]ratecord.Option{ratecord.WithGlobalLimit(100000, 10*time.Millisecond)}, opts...)
	tr := ratecord.NewTransport(newBase(), opts...)
	b.Cleanup(func() { tr.Close() })
	return tr
}

// BenchmarkBase is the base transport alone.
func BenchmarkBase(b *testing.B) {
	run(b, newBase())
}

// BenchmarkOtelhttp is otelhttp's transport over the base, with the SDK
// set-up.
func BenchmarkOtelhttp(b *testing.B) {
	tp, mp := sdk(b)
	run(b, otelhttp.NewTransport(newBase(), otelhttp.WithTracerProvider(tp), otelhttp.WithMeterProvider(mp)))
}

// BenchmarkRatecord is ratecord's request path over the base with
// telemetry off (the global providers are OpenTelemetry's no-ops).
func BenchmarkRatecord(b *testing.B) {
	run(b, ratecordTransport(b))
}

// BenchmarkRatecordTelemetry is BenchmarkRatecord with telemetry on, with
// the SDK set-up.
func BenchmarkRatecordTelemetry(b *testing.B) {
	tp, mp := sdk(b)
	run(b, ratecordTransport(b, ratecord.WithTracerProvider(tp), ratecord.WithMeterProvider(mp)))
}
