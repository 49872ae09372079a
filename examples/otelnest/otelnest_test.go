// Package otelnest_test shows ratecord's telemetry nested with otelhttp:
// ratecord outside, otelhttp as its base transport, so that each attempt is
// a client span of its own under ratecord's span for the logical request.
package otelnest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratecord/ratecord"
)

const webhookToken = "hA6cXzTUsyIEPl2rsoVnrm5bUgXvYbMzumVqpIsTGwQtb0ZD1Ow5IS8Q2-UEUyR8Y0Tp"

// discord answers the first message with a 429 (scope user, retry after
// 250 ms) and everything else with a 200. It records the trace headers it
// was sent.
type discord struct {
	*httptest.Server
	calls       atomic.Int32
	mu          sync.Mutex // guards traceparent
	traceparent []string
}

func newDiscord(t *testing.T) *discord {
	d := &discord{}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.traceparent = append(d.traceparent, r.Header.Values("Traceparent")...)
		d.mu.Unlock()
		h := w.Header()
		h.Set("X-RateLimit-Bucket", "f1b2c3d4")
		h.Set("X-RateLimit-Limit", "5")
		h.Set("X-RateLimit-Remaining", "4")
		h.Set("X-RateLimit-Reset-After", "5")
		if strings.HasSuffix(r.URL.Path, "/messages") && d.calls.Add(1) == 1 {
			h.Set("X-RateLimit-Remaining", "0")
			h.Set("X-RateLimit-Reset-After", "0.25")
			h.Set("X-RateLimit-Scope", "user")
			h.Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			fmt.Fprint(w, `{"message":"You are being rate limited.","retry_after":0.25,"global":false}`)
			return
		}
		fmt.Fprint(w, `{"id":"1"}`)
	}))
	t.Cleanup(d.Close)
	return d
}

// redactingExporter hands spans to an exporter with url.full cleaned by
// ratecord.RedactURL: otelhttp records the URL as it is, webhook and
// interaction tokens included.
type redactingExporter struct{ sdktrace.SpanExporter }

func (e redactingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = redactedSpan{s}
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

type redactedSpan struct{ sdktrace.ReadOnlySpan }

func (s redactedSpan) Attributes() []attribute.KeyValue {
	attrs := s.ReadOnlySpan.Attributes()
	out := make([]attribute.KeyValue, len(attrs))
	for i, kv := range attrs {
		if kv.Key == "url.full" {
			if u, err := url.Parse(kv.Value.AsString()); err == nil {
				kv = attribute.String("url.full", ratecord.RedactURL(u))
			}
		}
		out[i] = kv
	}
	return out
}

// nested returns a client with ratecord outside and otelhttp inside, both
// reporting to tp. otelhttp is told not to propagate: Discord needs no
// trace headers.
func nested(t *testing.T, tp trace.TracerProvider, opts ...ratecord.Option) *http.Client {
	base := otelhttp.NewTransport(http.DefaultTransport,
		otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.NewCompositeTextMapPropagator()))
	tr := ratecord.NewTransport(base, append([]ratecord.Option{ratecord.WithTracerProvider(tp)}, opts...)...)
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })
	return &http.Client{Transport: tr}
}

func send(t *testing.T, c *http.Client, method, url string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(`{"content":"hi"}`))
	req.Header.Set("Authorization", "Bot token")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(ratecord.RedactError(err))
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("%s %s: status %d; want 200", method, url, resp.StatusCode)
	}
}

func TestAttemptsNestUnderRatecordsSpan(t *testing.T) {
	t.Parallel()
	d := newDiscord(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	c := nested(t, tp)
	send(t, c, "POST", d.URL+"/api/v10/channels/123/messages")

	var root sdktrace.ReadOnlySpan
	var attempts, waits []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch {
		case s.Name() == "POST /channels/{channel_id}/messages":
			root = s
		case s.Name() == "ratecord.wait":
			waits = append(waits, s)
		case s.InstrumentationScope().Name == "go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp":
			attempts = append(attempts, s)
		}
	}
	if root == nil {
		t.Fatalf("no ratecord span among %d spans", len(rec.Ended()))
	}
	if root.Parent().IsValid() || root.SpanKind() != trace.SpanKindClient {
		t.Errorf("ratecord's span: parent %v, kind %v; want a client root span", root.Parent(), root.SpanKind())
	}
	if len(attempts) != 2 {
		t.Fatalf("%d otelhttp spans; want one per attempt, 2", len(attempts))
	}
	sort.Slice(attempts, func(i, j int) bool { return attempts[i].StartTime().Before(attempts[j].StartTime()) })
	for i, a := range attempts {
		if a.Parent().SpanID() != root.SpanContext().SpanID() || a.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("attempt %d is not a child of ratecord's span", i+1)
		}
		if a.SpanKind() != trace.SpanKindClient {
			t.Errorf("attempt %d: kind %v; want client", i+1, a.SpanKind())
		}
		// otelhttp ends its span when the body is closed, which may be
		// after RoundTrip returned and ratecord's span ended.
		if a.StartTime().Before(root.StartTime()) || a.StartTime().After(root.EndTime()) {
			t.Errorf("attempt %d did not start within ratecord's span", i+1)
		}
	}
	if got := [2]string{status(attempts[0]), status(attempts[1])}; got != [2]string{"429", "200"} {
		t.Errorf("attempt statuses = %v; want [429 200]", got)
	}
	if len(waits) != 1 || waits[0].Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("%d wait spans; want one under ratecord's span", len(waits))
	}
	if !waits[0].StartTime().After(attempts[0].EndTime()) || waits[0].EndTime().After(attempts[1].StartTime()) {
		t.Error("the wait is not between the two attempts")
	}
	if d := waits[0].EndTime().Sub(waits[0].StartTime()); d < 240*time.Millisecond {
		t.Errorf("wait of %v; want the 250ms retry_after", d)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.traceparent) != 0 {
		t.Errorf("Discord was sent traceparent %v; want none", d.traceparent)
	}
	t.Logf("span tree:\n%s", tree(rec.Ended()))
}

func status(s sdktrace.ReadOnlySpan) string {
	for _, kv := range s.Attributes() {
		if kv.Key == "http.response.status_code" {
			return kv.Value.String()
		}
	}
	return ""
}

func TestNestedTelemetryKeepsTokensOut(t *testing.T) {
	t.Parallel()
	d := newDiscord(t)
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(redactingExporter{exp}))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	c := nested(t, tp)
	send(t, c, "POST", d.URL+"/api/v10/webhooks/1/"+webhookToken+"?wait=true")

	spans := exp.GetSpans().Snapshots()
	if len(spans) != 2 {
		t.Fatalf("%d spans; want ratecord's and otelhttp's", len(spans))
	}
	var all strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&all, "%s %v %v %v\n", s.Name(), s.Attributes(), s.Events(), s.Status())
	}
	if !strings.Contains(all.String(), "/webhooks/1/REDACTED?wait=true") {
		t.Errorf("no redacted url.full in:\n%s", all.String())
	}
	for i := 0; i+9 <= len(webhookToken); i++ {
		if strings.Contains(all.String(), webhookToken[i:i+9]) {
			t.Fatalf("a piece of the token (%q) reached the exporter:\n%s", webhookToken[i:i+9], all.String())
		}
	}
}

// global holds the providers TestGlobalProviders sets once per process:
// OpenTelemetry forwards only to the first global providers set.
var global struct {
	once   sync.Once
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
}

// TestGlobalProviders shows that a program that set the global providers
// gets ratecord's telemetry without an option, even from a transport
// created before they were set.
func TestGlobalProviders(t *testing.T) {
	// Not parallel: it sets the global providers.
	d := newDiscord(t)
	tr := ratecord.NewTransport(nil) // the first time, before the providers are set
	t.Cleanup(func() { tr.Close(); tr.CloseIdleConnections() })
	global.once.Do(func() {
		global.spans = tracetest.NewSpanRecorder()
		global.reader = sdkmetric.NewManualReader()
		otel.SetTracerProvider(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(global.spans)))
		otel.SetMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(global.reader)))
	})
	before := len(global.spans.Ended())

	send(t, &http.Client{Transport: tr}, "GET", d.URL+"/api/v10/channels/123")
	if spans := global.spans.Ended()[before:]; len(spans) != 1 || spans[0].Name() != "GET /channels/{channel_id}" {
		t.Errorf("spans = %v; want ratecord's GET /channels/{channel_id}", spans)
	}
	var rm metricdata.ResourceMetrics
	if err := global.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			found = found || m.Name == "discord.ratelimit.wait.duration"
		}
	}
	if !found {
		t.Error("no discord.ratelimit.wait.duration metric from the global meter provider")
	}
}

// tree prints spans as an indented tree, children and events in time
// order, with the attributes an operator looks at first.
func tree(spans []sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Parent().IsValid() {
			children[s.Parent().SpanID()] = append(children[s.Parent().SpanID()], s)
		} else {
			roots = append(roots, s)
		}
	}
	type line struct {
		at   time.Time
		text string
		span sdktrace.ReadOnlySpan
	}
	var walk func(s sdktrace.ReadOnlySpan, indent string, t0 time.Time)
	walk = func(s sdktrace.ReadOnlySpan, indent string, t0 time.Time) {
		fmt.Fprintf(&b, "%s%s  [%s, +%v, %v]%s\n", indent, s.Name(), s.SpanKind(),
			s.StartTime().Sub(t0).Round(time.Millisecond), s.EndTime().Sub(s.StartTime()).Round(time.Millisecond), attrs(s.Attributes()))
		var lines []line
		for _, c := range children[s.SpanContext().SpanID()] {
			lines = append(lines, line{at: c.StartTime(), span: c})
		}
		for _, e := range s.Events() {
			lines = append(lines, line{at: e.Time, text: fmt.Sprintf("event %s  [+%v]%s", e.Name, e.Time.Sub(t0).Round(time.Millisecond), attrs(e.Attributes))})
		}
		sort.SliceStable(lines, func(i, j int) bool { return lines[i].at.Before(lines[j].at) })
		for _, l := range lines {
			if l.span != nil {
				walk(l.span, indent+"  ", t0)
			} else {
				fmt.Fprintf(&b, "%s  %s\n", indent, l.text)
			}
		}
	}
	for _, r := range roots {
		walk(r, "", r.StartTime())
	}
	return b.String()
}

// shown are the attributes tree prints.
var shown = []attribute.Key{
	"url.template", "url.full", "http.response.status_code", "http.request.resend_count", "error.type",
	"discord.ratelimit.bucket", "discord.ratelimit.scope", "discord.ratelimit.retry_after", "discord.ratelimit.waited",
}

func attrs(kvs []attribute.KeyValue) string {
	var b strings.Builder
	for _, k := range shown {
		for _, kv := range kvs {
			if kv.Key == k {
				v := kv.Value.String()
				if kv.Value.Type() == attribute.FLOAT64 {
					v = fmt.Sprintf("%.3f", kv.Value.AsFloat64())
				}
				fmt.Fprintf(&b, " %s=%s", k, v)
			}
		}
	}
	return b.String()
}
