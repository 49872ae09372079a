package ratecord_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/jarcoal/httpmock"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
	"github.com/ratecord/ratecord/store/redisstore"
)

// rig records what a transport reports: ended spans, and metrics on demand.
type rig struct {
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
	opts   []ratecord.Option
}

func newRig(t *testing.T) *rig {
	t.Helper()
	r := &rig{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	r.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(r.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r.reader))
	t.Cleanup(func() {
		r.tp.Shutdown(context.Background())
		mp.Shutdown(context.Background())
	})
	r.opts = []ratecord.Option{ratecord.WithTracerProvider(r.tp), ratecord.WithMeterProvider(mp)}
	return r
}

// roots returns the ended spans without a parent recorded by r.
func (r *rig) roots() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if !s.Parent().IsValid() {
			out = append(out, s)
		}
	}
	return out
}

// children returns the ended spans whose parent is p.
func (r *rig) children(p sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range r.spans.Ended() {
		if s.Parent().SpanID() == p.SpanContext().SpanID() {
			out = append(out, s)
		}
	}
	return out
}

func (r *rig) metrics(t *testing.T) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// sum adds the points of a counter or up-down counter whose attributes
// include want; ok is false when no point matched.
func sum(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) (total int64, ok bool) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			if s, isSum := m.Data.(metricdata.Sum[int64]); isSum {
				for _, dp := range s.DataPoints {
					if hasAll(dp.Attributes, want) {
						total, ok = total+dp.Value, true
					}
				}
			}
		}
	}
	return total, ok
}

// histogram returns the count and sum of a histogram's points whose
// attributes include want.
func histogram(rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) (count uint64, total float64) {
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == name {
				for _, dp := range h.DataPoints {
					if hasAll(dp.Attributes, want) {
						count += dp.Count
						total += dp.Sum
					}
				}
			}
		}
	}
	return count, total
}

func hasAll(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// attr returns the value of key among kvs.
func attr(kvs []attribute.KeyValue, key string) (attribute.Value, bool) {
	for _, kv := range kvs {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs checks that kvs hold want, by their printed values.
func wantAttrs(t *testing.T, what string, kvs []attribute.KeyValue, want map[string]string) {
	t.Helper()
	for k, w := range want {
		v, ok := attr(kvs, k)
		if !ok {
			t.Errorf("%s: no attribute %s; want %q", what, k, w)
			continue
		}
		if got := v.String(); got != w {
			t.Errorf("%s: %s = %q; want %q", what, k, got, w)
		}
	}
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, e := range s.Events() {
		names = append(names, e.Name)
	}
	return names
}

func event(s sdktrace.ReadOnlySpan, name string) (sdktrace.Event, bool) {
	for _, e := range s.Events() {
		if e.Name == name {
			return e, true
		}
	}
	return sdktrace.Event{}, false
}

var (
	postMessages = []attribute.KeyValue{
		attribute.String("http.request.method", "POST"),
		attribute.String("url.template", "/channels/{channel_id}/messages"),
	}
	getChannel = []attribute.KeyValue{
		attribute.String("http.request.method", "GET"),
		attribute.String("url.template", "/channels/{channel_id}"),
	}
)

func TestTelemetryPlainRequest(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	f := newFakeDiscord()
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, f.bucket("msg", 5, time.Second, false))
	c, _ := newClient(t, mock, r.opts...)
	okResp(t)(do(t, c, "POST", api+"/channels/123/messages", "Bot a"))

	roots := r.roots()
	if len(roots) != 1 {
		t.Fatalf("%d root spans; want 1", len(roots))
	}
	s := roots[0]
	if s.Name() != "POST /channels/{channel_id}/messages" || s.SpanKind() != trace.SpanKindClient {
		t.Errorf("span %q kind %v; want \"POST /channels/{channel_id}/messages\", client", s.Name(), s.SpanKind())
	}
	wantAttrs(t, "span", s.Attributes(), map[string]string{
		"http.request.method":       "POST",
		"url.template":              "/channels/{channel_id}/messages",
		"url.full":                  api + "/channels/123/messages",
		"server.address":            "discord.test",
		"server.port":               "443",
		"http.response.status_code": "200",
		"discord.ratelimit.route":   "POST /channels/:id/messages",
		"discord.ratelimit.bucket":  "msg",
	})
	for _, k := range []string{"error.type", "http.request.resend_count"} {
		if _, ok := attr(s.Attributes(), k); ok {
			t.Errorf("span has %s; want none for a plain success", k)
		}
	}
	if s.Status().Code == codes.Error || len(s.Events()) != 0 || len(r.children(s)) != 0 {
		t.Errorf("status %v, events %v, %d children; want a plain span", s.Status(), eventNames(s), len(r.children(s)))
	}

	rm := r.metrics(t)
	if n, total := histogram(rm, "discord.ratelimit.wait.duration", postMessages...); n != 1 || total != 0 {
		t.Errorf("wait histogram: %d points, %v s; want 1 of 0 s", n, total)
	}
	if n, ok := sum(rm, "discord.ratelimit.queued", postMessages...); !ok || n != 0 {
		t.Errorf("queued = %d (reported %v); want 0", n, ok)
	}
	if _, ok := sum(rm, "discord.ratelimit.rate_limited"); ok {
		t.Error("rate_limited reported; want nothing")
	}
}

func TestTelemetryBucketWait(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, exhausted("m", "0.2"))
	c, _ := newClient(t, mock, r.opts...)
	okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))

	done := make(chan struct{})
	go func() {
		defer close(done)
		okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))
	}()
	// While it waits, it is counted as queued.
	queued := false
	for deadline := time.Now().Add(150 * time.Millisecond); !queued && time.Now().Before(deadline); {
		n, _ := sum(r.metrics(t), "discord.ratelimit.queued", postMessages...)
		queued = n == 1
	}
	<-done
	if !queued {
		t.Error("discord.ratelimit.queued never read 1 while the request waited")
	}

	roots := r.roots()
	if len(roots) != 2 {
		t.Fatalf("%d root spans; want 2", len(roots))
	}
	waits := r.children(roots[1])
	if len(r.children(roots[0])) != 0 || len(waits) != 1 || waits[0].Name() != "ratecord.wait" {
		t.Fatalf("children %d and %d; want none under the first request, one ratecord.wait under the second", len(r.children(roots[0])), len(waits))
	}
	w := waits[0]
	wantAttrs(t, "wait span", w.Attributes(), map[string]string{"discord.ratelimit.bucket": "m", "discord.ratelimit.store": "memstore"})
	if d := w.EndTime().Sub(w.StartTime()); d < 150*time.Millisecond {
		t.Errorf("wait span lasted %v; want about the 200ms reset", d)
	}
	if v, _ := attr(w.Attributes(), "discord.ratelimit.waited"); v.AsFloat64() < 0.15 {
		t.Errorf("discord.ratelimit.waited = %v; want about 0.2", v.AsFloat64())
	}
	if w.StartTime().Before(roots[1].StartTime()) || w.EndTime().After(roots[1].EndTime()) {
		t.Error("the wait span is not within its request's span")
	}
	rm := r.metrics(t)
	if n, total := histogram(rm, "discord.ratelimit.wait.duration", postMessages...); n != 2 || total < 0.15 {
		t.Errorf("wait histogram: %d points, %v s; want 2 adding up to about 0.2 s", n, total)
	}
	if n, _ := sum(rm, "discord.ratelimit.queued", postMessages...); n != 0 {
		t.Errorf("queued = %d after both requests; want 0", n)
	}
}

func TestTelemetryGlobalWait(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, httpmock.NewStringResponder(200, `{}`))
	c, _ := newClient(t, mock, append(r.opts, ratecord.WithGlobalLimit(1, 150*time.Millisecond))...)
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a"))
	okResp(t)(do(t, c, "GET", api+"/channels/2", "Bot a")) // another major, the same credential

	roots := r.roots()
	if len(roots) != 2 {
		t.Fatalf("%d root spans; want 2", len(roots))
	}
	waits := r.children(roots[1])
	if len(waits) != 1 || waits[0].Name() != "ratecord.wait" {
		t.Fatalf("%d children of the second request; want one ratecord.wait", len(waits))
	}
	if d := waits[0].EndTime().Sub(waits[0].StartTime()); d < 100*time.Millisecond {
		t.Errorf("global wait lasted %v; want about 150ms", d)
	}
	if _, ok := attr(waits[0].Attributes(), "discord.ratelimit.bucket"); ok {
		t.Error("a wait on the global limit names a bucket")
	}
	if n, total := histogram(r.metrics(t), "discord.ratelimit.wait.duration", getChannel...); n != 2 || total < 0.1 {
		t.Errorf("wait histogram: %d points, %v s; want 2 adding up to about 0.15 s", n, total)
	}
}

func TestTelemetry429Scopes(t *testing.T) {
	t.Parallel()
	const body = `{"message":"You are being rate limited.","retry_after":0.1,"global":false}`
	bucket := []string{"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "5", "X-RateLimit-Bucket", "m"}
	tests := []struct {
		scope   string
		status  int
		body    string
		headers []string
	}{
		{"user", 429, body, append([]string{"X-RateLimit-Scope", "user"}, bucket...)},
		{"shared", 429, body, append([]string{"X-RateLimit-Scope", "shared"}, bucket...)},
		{"global", 429, `{"message":"You are being rate limited.","retry_after":0.1,"global":true}`, []string{"X-RateLimit-Scope", "global", "X-RateLimit-Global", "true"}},
		{"blocked", 429, `<html>error code: 1015</html>`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.scope, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			f := newFakeDiscord()
			mock := httpmock.NewMockTransport()
			var calls atomic.Int32
			limited := f.plain(tc.status, tc.body, tc.headers...)
			ok := f.plain(200, `{}`, bucket...)
			mock.RegisterRegexpResponder("POST", messagesRE, func(req *http.Request) (*http.Response, error) {
				if calls.Add(1) == 1 {
					return limited(req)
				}
				return ok(req)
			})
			fixed := func() backoff.BackOff { return backoff.NewConstantBackOff(100 * time.Millisecond) }
			c, _ := newClient(t, mock, append(r.opts, ratecord.WithBackOff(fixed))...)
			okResp(t)(do(t, c, "POST", api+"/channels/1/messages", "Bot a"))

			roots := r.roots()
			if len(roots) != 1 {
				t.Fatalf("%d root spans; want 1", len(roots))
			}
			s := roots[0]
			wantAttrs(t, "span", s.Attributes(), map[string]string{
				"http.response.status_code": "200",
				"http.request.resend_count": "1",
			})
			if got := strings.Join(eventNames(s), ","); got != "ratecord.rate_limited,ratecord.retry" {
				t.Fatalf("events = %s; want ratecord.rate_limited,ratecord.retry", got)
			}
			limitedEv, _ := event(s, "ratecord.rate_limited")
			wantAttrs(t, "rate_limited event", limitedEv.Attributes, map[string]string{
				"discord.ratelimit.scope":   tc.scope,
				"http.response.status_code": "429",
				"http.request.resend_count": "0",
			})
			retryEv, _ := event(s, "ratecord.retry")
			wantAttrs(t, "retry event", retryEv.Attributes, map[string]string{
				"discord.ratelimit.scope":   tc.scope,
				"http.request.resend_count": "1",
			})
			for _, e := range []sdktrace.Event{limitedEv, retryEv} {
				if v, _ := attr(e.Attributes, "discord.ratelimit.retry_after"); v.AsFloat64() < 0.1 {
					t.Errorf("%s: retry_after = %v; want at least 0.1", e.Name, v.AsFloat64())
				}
			}
			waits := r.children(s)
			if len(waits) != 1 || waits[0].Name() != "ratecord.wait" {
				t.Fatalf("%d children; want the retry's ratecord.wait", len(waits))
			}
			wantAttrs(t, "wait span", waits[0].Attributes(), map[string]string{"discord.ratelimit.scope": tc.scope})

			rm := r.metrics(t)
			scope := attribute.String("discord.ratelimit.scope", tc.scope)
			if n, _ := sum(rm, "discord.ratelimit.rate_limited", append(postMessages, scope)...); n != 1 {
				t.Errorf("rate_limited{scope=%s} = %d; want 1", tc.scope, n)
			}
			if n, _ := sum(rm, "discord.ratelimit.retries", append(postMessages, scope)...); n != 1 {
				t.Errorf("retries{scope=%s} = %d; want 1", tc.scope, n)
			}
		})
	}
}

func TestTelemetryServerErrorRetry(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	mock := httpmock.NewMockTransport()
	var calls atomic.Int32
	mock.RegisterRegexpResponder("GET", channelRE, func(*http.Request) (*http.Response, error) {
		if calls.Add(1) == 1 {
			return httpmock.NewStringResponse(502, `bad gateway`), nil
		}
		return httpmock.NewStringResponse(200, `{}`), nil
	})
	fast := func() backoff.BackOff { return backoff.NewConstantBackOff(time.Millisecond) }
	c, _ := newClient(t, mock, append(r.opts, ratecord.WithBackOff(fast))...)
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a"))
	s := r.roots()[0]
	retry, ok := event(s, "ratecord.retry")
	if !ok {
		t.Fatalf("events = %v; want a ratecord.retry", eventNames(s))
	}
	wantAttrs(t, "retry event", retry.Attributes, map[string]string{"http.response.status_code": "502", "http.request.resend_count": "1"})
	if n, _ := sum(r.metrics(t), "discord.ratelimit.retries", append(getChannel, attribute.String("error.type", "502"))...); n != 1 {
		t.Errorf("retries{error.type=502} = %d; want 1", n)
	}
}

func TestTelemetryGuardRefusal(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, httpmock.NewStringResponder(403, `{"message":"Missing Access","code":50001}`))
	c, _ := newClient(t, mock, append(r.opts, ratecord.WithInvalidRequestBudget(1))...)
	if resp, err := do(t, c, "GET", api+"/channels/1", "Bot a"); err != nil || resp.StatusCode != 403 {
		t.Fatalf("first request: %v; want the 403", err)
	}
	if _, err := do(t, c, "GET", api+"/channels/1", "Bot a"); !errors.Is(err, ratecord.ErrInvalidBudget) {
		t.Fatalf("second request: %v; want the guard's refusal", err)
	}
	roots := r.roots()
	if len(roots) != 2 {
		t.Fatalf("%d root spans; want 2", len(roots))
	}
	wantAttrs(t, "403 span", roots[0].Attributes(), map[string]string{"http.response.status_code": "403", "error.type": "403"})
	refused := roots[1]
	wantAttrs(t, "refused span", refused.Attributes(), map[string]string{"error.type": "invalid_budget"})
	if refused.Status().Code != codes.Error || refused.Status().Description != "invalid_budget" {
		t.Errorf("status = %+v; want an error described as invalid_budget", refused.Status())
	}
	if _, ok := attr(refused.Attributes(), "http.response.status_code"); ok {
		t.Error("a refused request has a status code")
	}
	ev, ok := event(refused, "ratecord.guard_tripped")
	if !ok {
		t.Fatalf("events = %v; want ratecord.guard_tripped", eventNames(refused))
	}
	wantAttrs(t, "guard event", ev.Attributes, map[string]string{"discord.ratelimit.scope": "guard", "error.type": "invalid_budget"})
	if n, _ := sum(r.metrics(t), "discord.ratelimit.guard.refusals", append(getChannel, attribute.String("error.type", "invalid_budget"))...); n != 1 {
		t.Errorf("guard.refusals = %d; want 1", n)
	}
}

// flakyStore is a memory store whose reports always fail and whose
// Acquire fails when told to; it reports fallbacks to a local limiter.
type flakyStore struct {
	store.Store
	failAcquire atomic.Bool
}

var errBackend = errors.New("backend unreachable")

func (s *flakyStore) Acquire(ctx context.Context, c store.Claim) (*store.Reservation, error) {
	if s.failAcquire.Load() {
		return nil, errBackend
	}
	r, err := s.Store.Acquire(ctx, c)
	if err != nil {
		return nil, err
	}
	return store.NewReservation(s, c, r.Bucket, r.Waited, r, 0), nil
}

func (s *flakyStore) Settle(ctx context.Context, r *store.Reservation, u store.Update) error {
	inner, _ := r.Handle()
	inner.(*store.Reservation).Report(ctx, u)
	return errBackend
}

func (s *flakyStore) Fallbacks() uint64 { return 3 }

var _ ratecord.FallbackCounter = (*flakyStore)(nil)

func TestTelemetryStoreFailure(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	fs := &flakyStore{Store: memstore.New()}
	t.Cleanup(func() { fs.Close() })
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("GET", channelRE, httpmock.NewStringResponder(200, `{}`))
	c, _ := newClient(t, mock, append(r.opts, ratecord.WithStore(fs))...)
	okResp(t)(do(t, c, "GET", api+"/channels/1", "Bot a"))
	fs.failAcquire.Store(true)
	_, err := do(t, c, "GET", api+"/channels/1", "Bot a")
	if !errors.Is(err, errBackend) {
		t.Fatalf("err = %v; want the store's error", err)
	}

	roots := r.roots()
	if len(roots) != 2 {
		t.Fatalf("%d root spans; want 2", len(roots))
	}
	ev, ok := event(roots[0], "ratecord.store_error")
	if !ok {
		t.Fatalf("events = %v; want ratecord.store_error for the failed update", eventNames(roots[0]))
	}
	wantAttrs(t, "update error", ev.Attributes, map[string]string{"discord.ratelimit.store.operation": "update", "discord.ratelimit.store": "ratecord_test"})
	wantAttrs(t, "succeeded span", roots[0].Attributes(), map[string]string{"http.response.status_code": "200"})
	ev, ok = event(roots[1], "ratecord.store_error")
	if !ok {
		t.Fatalf("events = %v; want ratecord.store_error for the failed acquire", eventNames(roots[1]))
	}
	wantAttrs(t, "acquire error", ev.Attributes, map[string]string{"discord.ratelimit.store.operation": "acquire"})
	wantAttrs(t, "failed span", roots[1].Attributes(), map[string]string{"error.type": "*errors.errorString"})

	rm := r.metrics(t)
	store := attribute.String("discord.ratelimit.store", "ratecord_test")
	if n, _ := sum(rm, "discord.ratelimit.store.errors", store, attribute.String("discord.ratelimit.store.operation", "update")); n != 1 {
		t.Errorf("store.errors{operation=update} = %d; want 1", n)
	}
	if n, _ := sum(rm, "discord.ratelimit.store.errors", store, attribute.String("discord.ratelimit.store.operation", "acquire")); n != 1 {
		t.Errorf("store.errors{operation=acquire} = %d; want 1", n)
	}
	if n, _ := sum(rm, "discord.ratelimit.store.fallbacks", store); n != 3 {
		t.Errorf("store.fallbacks = %d; want the store's 3", n)
	}
}

func TestTelemetryNoPropagationUnlessAsked(t *testing.T) {
	// Not parallel: it sets the global propagator.
	old := otel.GetTextMapPropagator()
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTextMapPropagator(old) })

	for _, on := range []bool{false, true} {
		t.Run(fmt.Sprintf("propagation=%v", on), func(t *testing.T) {
			r := newRig(t)
			mock := httpmock.NewMockTransport()
			var got atomic.Value
			mock.RegisterRegexpResponder("GET", channelRE, func(req *http.Request) (*http.Response, error) {
				got.Store(req.Header.Get("Traceparent"))
				return httpmock.NewStringResponse(200, `{}`), nil
			})
			c, _ := newClient(t, mock, append(r.opts, ratecord.WithPropagation(on))...)
			// The caller's own span: even with it in the context, nothing
			// is sent unless asked.
			ctx, parent := r.tp.Tracer("test").Start(context.Background(), "caller")
			req, _ := http.NewRequestWithContext(ctx, "GET", api+"/channels/1", nil)
			req.Header.Set("Authorization", "Bot a")
			resp, err := c.Do(req)
			parent.End()
			mustOK(t, resp, err)
			if len(req.Header) != 1 {
				t.Errorf("caller's headers = %v; want them untouched", req.Header)
			}
			tp := got.Load().(string)
			if !on {
				if tp != "" {
					t.Errorf("traceparent %q sent to Discord; want none", tp)
				}
				return
			}
			var span sdktrace.ReadOnlySpan
			for _, s := range r.spans.Ended() {
				if s.Name() == "GET /channels/{channel_id}" {
					span = s
				}
			}
			if span == nil || span.Parent().SpanID() != parent.SpanContext().SpanID() {
				t.Fatal("ratecord's span is not a child of the caller's")
			}
			want := fmt.Sprintf("00-%s-%s-01", span.SpanContext().TraceID(), span.SpanContext().SpanID())
			if tp != want {
				t.Errorf("traceparent = %q; want %q", tp, want)
			}
		})
	}
}

// TestTelemetryOffAllocatesNothing keeps the request path free of
// allocations while the global providers are OpenTelemetry's defaults.
func TestTelemetryOffAllocatesNothing(t *testing.T) {
	// Not parallel: AllocsPerRun counts every goroutine's allocations.
	resp := &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}
	resp.Header.Set("X-RateLimit-Limit", "1000000")
	resp.Header.Set("X-RateLimit-Remaining", "999999")
	resp.Header.Set("X-RateLimit-Reset-After", "1")
	resp.Header.Set("X-RateLimit-Bucket", "abcdef")
	tr := ratecord.NewTransport(staticTransport{resp}, ratecord.WithGlobalLimit(100000, time.Millisecond))
	defer tr.Close()
	req, _ := http.NewRequest("POST", api+"/channels/1/messages", http.NoBody)
	req.Header.Set("Authorization", "Bot a")
	tr.RoundTrip(req)
	if n := testing.AllocsPerRun(200, func() { tr.RoundTrip(req) }); n != 0 {
		t.Errorf("%v allocations per request with telemetry off; want 0", n)
	}
}

// secretTraffic is a mix of requests carrying a bot token, a webhook token
// and interaction tokens, answered with 429s of each scope, 5xx, 401, 404
// and network errors, so that every telemetry path runs. It returns the
// secrets to look for and what the transport logged.
func secretTraffic(t *testing.T, opts ...ratecord.Option) (secrets []string, logs string) {
	t.Helper()
	const (
		bot         = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.secretsecretsecretsecretsecretsecret12"
		badBot      = "MTk4NzY1NDMyMTAxMjM0NTY3.XyZwVu.anothersecretanothersecretanother34"
		hook        = "hA6cXzTUsyIEPl2rsoVnrm5bUgXvYbMzumVqpIsTGwQtb0ZD1Ow5IS8Q2-UEUyR8Y0Tp"
		deadHook    = "qZ9rT4wYpL2mN8vB6xC1kJ5hG3fD7sA0eR2tY4uI6oP8aS1dF3gH5jK7lZ9xC2vB4n"
		interaction = "aW50ZXJhY3Rpb246MTIzNDU2Nzg5MDEyMzQ1Njc4OTpzZWNyZXRzZWNyZXRzZWNyZXQ"
	)
	mock := httpmock.NewMockTransport()
	var n atomic.Int32
	limited := func(scope string) httpmock.Responder {
		return httpmock.NewStringResponder(429, `{"retry_after":0.01,"global":`+fmt.Sprint(scope == "global")+`}`).
			HeaderSet(http.Header{"X-Ratelimit-Scope": {scope}, "X-Ratelimit-Bucket": {"b1"}})
	}
	responders := []httpmock.Responder{
		limited("user"), limited("shared"), limited("global"),
		httpmock.NewStringResponder(429, `<html>1015</html>`),
		httpmock.NewStringResponder(503, `unavailable`),
		httpmock.NewErrorResponder(errors.New("connection reset")),
	}
	ok := httpmock.NewStringResponder(200, `{}`).HeaderSet(http.Header{
		"X-Ratelimit-Bucket": {"b1"}, "X-Ratelimit-Limit": {"5"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset-After": {"0.02"},
	})
	mock.RegisterNoResponder(func(req *http.Request) (*http.Response, error) {
		switch {
		case strings.Contains(req.URL.Path, deadHook):
			return httpmock.NewStringResponse(404, `{"message":"Unknown Webhook","code":10015}`), nil
		case req.Header.Get("Authorization") == "Bot "+badBot:
			return httpmock.NewStringResponse(401, `{"message":"401: Unauthorized","code":0}`), nil
		}
		i := int(n.Add(1))
		if i%2 == 1 && i/2 < len(responders) {
			return responders[i/2](req)
		}
		return ok(req)
	})
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewJSONHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	fast := func() backoff.BackOff { return backoff.NewConstantBackOff(5 * time.Millisecond) }
	c, _ := newClient(t, mock, append(opts, ratecord.WithLogger(logger), ratecord.WithBackOff(fast), ratecord.WithRetryNonIdempotent(true))...)
	urls := []struct{ method, path, auth string }{
		{"POST", "/channels/1/messages", bot},
		{"GET", "/users/@me", bot},
		{"POST", "/webhooks/1/" + hook, ""},
		{"POST", "/webhooks/1/" + hook + "?wait=true", bot},
		{"PATCH", "/webhooks/2/" + interaction + "/messages/@original", ""},
		{"POST", "/interactions/3/" + interaction + "/callback", ""},
		{"DELETE", "/webhooks/4/" + deadHook, ""},
		{"GET", "/users/@me", badBot},
	}
	for round := 0; round < 3; round++ {
		for _, u := range urls {
			auth := ""
			if u.auth != "" {
				auth = "Bot " + u.auth
			}
			do(t, c, u.method, api+u.path, auth)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if buf.Len() == 0 {
		t.Fatal("nothing was logged; the test would prove nothing")
	}
	return []string{bot, badBot, hook, deadHook, interaction}, buf.String()
}

// telemetryText prints every span name, attribute, event, status and
// metric attribute recorded by r.
func telemetryText(t *testing.T, r *rig) string {
	t.Helper()
	var b strings.Builder
	for _, s := range r.spans.Ended() {
		fmt.Fprintf(&b, "span %s %v %v\n", s.Name(), s.Status(), s.Attributes())
		for _, e := range s.Events() {
			fmt.Fprintf(&b, "  event %s %v\n", e.Name, e.Attributes)
		}
		for _, l := range s.Links() {
			fmt.Fprintf(&b, "  link %v\n", l.Attributes)
		}
	}
	rm := r.metrics(t)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			fmt.Fprintf(&b, "metric %s %s\n", m.Name, m.Unit)
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					fmt.Fprintf(&b, "  %v %d\n", dp.Attributes.ToSlice(), dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					fmt.Fprintf(&b, "  %v %d\n", dp.Attributes.ToSlice(), dp.Count)
				}
			default:
				t.Fatalf("metric %s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return b.String()
}

// secretStores are the stores the secrets test runs against. A store
// whose state can be dumped (keys and values of a shared backend) gives
// dump; it is searched for secrets too.
var secretStores = []struct {
	name string
	new  func(t *testing.T) (s store.Store, dump func() string)
}{
	{"memstore", func(t *testing.T) (store.Store, func() string) {
		s := memstore.New()
		t.Cleanup(func() { s.Close() })
		return s, nil
	}},
	{"redisstore", func(t *testing.T) (store.Store, func() string) { return newRedisSecretStore(t) }},
}

// newRedisSecretStore opens a Redis store on REDIS_ADDR (default
// 127.0.0.1:6379) under a key prefix of its own, and dumps every key and
// value under that prefix. Without a server the test is skipped, or fails
// when CI=true.
func newRedisSecretStore(t *testing.T, opts ...redisstore.Option) (store.Store, func() string) {
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { client.Close() })
	if err := client.Ping(t.Context()).Err(); err != nil {
		msg := fmt.Sprintf("no Redis at %s (%v): set REDIS_ADDR to run the secrets test against the Redis store", addr, err)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	prefix := fmt.Sprintf("ratecord-secrets-test-%d", time.Now().UnixNano())
	s := redisstore.New(client, append([]redisstore.Option{redisstore.WithPrefix(prefix)}, opts...)...)
	ctx := context.Background()
	keys := func() []string {
		var all []string
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			all = append(all, iter.Val())
		}
		return all
	}
	t.Cleanup(func() {
		s.Close()
		if ks := keys(); len(ks) > 0 {
			client.Del(ctx, ks...)
		}
	})
	return s, func() string {
		var b strings.Builder
		ks := keys()
		if len(ks) == 0 {
			t.Errorf("the Redis store wrote no key under %q; the dump would prove nothing", prefix)
		}
		for _, k := range ks {
			fmt.Fprintf(&b, "%s ", k)
			switch client.Type(ctx, k).Val() {
			case "hash":
				fmt.Fprintln(&b, client.HGetAll(ctx, k).Val())
			case "zset":
				fmt.Fprintln(&b, client.ZRangeWithScores(ctx, k, 0, -1).Val())
			case "string":
				fmt.Fprintln(&b, client.Get(ctx, k).Val())
			case "list":
				fmt.Fprintln(&b, client.LRange(ctx, k, 0, -1).Val())
			case "set":
				fmt.Fprintln(&b, client.SMembers(ctx, k).Val())
			}
		}
		return b.String()
	}
}

func TestNoSecretsInTelemetry(t *testing.T) {
	t.Parallel()
	for _, st := range secretStores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t)
			s, dump := st.new(t)
			secrets, logs := secretTraffic(t, append(r.opts, ratecord.WithStore(s))...)
			all := telemetryText(t, r)
			for _, want := range []string{"ratecord.rate_limited", "ratecord.retry", "ratecord.guard_tripped", "ratecord.wait", "REDACTED",
				"{webhook_token}", "{interaction_token}", "discord.ratelimit.rate_limited", "discord.ratelimit.retries", "discord.ratelimit.guard.refusals"} {
				if !strings.Contains(all, want) {
					t.Errorf("telemetry lacks %q; the traffic mix missed a path:\n%s", want, all)
				}
			}
			all += logs
			if dump != nil {
				all += dump()
			}
			for _, secret := range secrets {
				for i := 0; i+9 <= len(secret); i++ {
					if strings.Contains(all, secret[i:i+9]) {
						t.Fatalf("a piece of a token (%q) appears in telemetry, logs or the store:\n%s", secret[i:i+9], all)
					}
				}
			}
		})
	}
}
