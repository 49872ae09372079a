package ratecord

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratecord/ratecord/store"
)

// reqTelemetry follows one request through RoundTrip: its span, if any,
// and its metrics. With telemetry off every method returns at once and
// nothing is allocated.
type reqTelemetry struct {
	t      *telemetry
	ctx    context.Context // carries span
	url    *url.URL        // the request's
	route  string          // the route key
	desc   *route          // nil until needed
	span   trace.Span      // nil when no span was started
	rec    bool            // span is recording
	bucket string          // the last bucket hash learned
	scope  store.Scope     // the last 429's scope: what the next wait is for
	resent int             // times the request was sent again
}

// start begins a request's telemetry. The context it returns carries the
// request's span, if one was started. The span's attributes are set when
// it ends, all at once.
func (t *telemetry) start(req *http.Request, key *routeKey) (context.Context, reqTelemetry) {
	r := reqTelemetry{t: t, ctx: req.Context(), url: req.URL, route: key.route}
	if !t.tracing() {
		return r.ctx, r
	}
	parent := trace.SpanContextFromContext(r.ctx)
	r.ctx, r.span = t.tracer.Start(r.ctx, r.describe().span, t.startOpts...)
	r.rec = r.span.IsRecording()
	t.learn(r.span, parent)
	return r.ctx, r
}

// describe returns the request's route descriptor, looking it up once.
func (r *reqTelemetry) describe() *route {
	if r.desc == nil {
		r.desc = r.t.routes.lookup(r.route)
	}
	return r.desc
}

// outgoing returns the request to hand to the base transport: out itself,
// or a copy carrying the request's span (so that an instrumented base
// transport nests its spans under it) and, with WithPropagation, the trace
// headers.
func (r *reqTelemetry) outgoing(out *http.Request) *http.Request {
	if r.span == nil && !r.t.propagate {
		return out
	}
	if r.ctx != out.Context() {
		out = out.WithContext(r.ctx)
	}
	if r.t.propagate {
		if r.span == nil && !trace.SpanContextFromContext(r.ctx).IsValid() {
			return out
		}
		out = out.Clone(r.ctx) // the headers are the caller's
		otel.GetTextMapPropagator().Inject(r.ctx, propagationHeader(out.Header))
	}
	return out
}

// propagationHeader adapts http.Header to a TextMapCarrier.
type propagationHeader http.Header

func (h propagationHeader) Get(k string) string { return http.Header(h).Get(k) }
func (h propagationHeader) Set(k, v string)     { http.Header(h).Set(k, v) }
func (h propagationHeader) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// queue counts the request in (+1) or out (-1) of the queue for a slot.
func (r *reqTelemetry) queue(n int64) {
	if r.t.queued.Enabled(r.ctx) {
		r.t.queued.Add(r.ctx, n, r.describe().tel.add...)
	}
}

// acquired records a granted slot: how long it took, and a child span for
// a wait.
func (r *reqTelemetry) acquired(p *store.Reservation) {
	r.bucket = p.Bucket
	if r.t.wait.Enabled(r.ctx) {
		r.t.wait.Record(r.ctx, p.Waited.Seconds(), r.describe().tel.rec...)
	}
	if !r.rec || p.Waited <= 0 {
		return
	}
	end := time.Now()
	attrs := make([]attribute.KeyValue, 0, 4)
	attrs = append(attrs, attrWaited.Float64(p.Waited.Seconds()), r.t.store)
	if p.Bucket != "" {
		attrs = append(attrs, attrBucket.String(p.Bucket))
	}
	if r.scope != "" {
		// A retry's wait: the 429 said what for.
		attrs = append(attrs, attrScope.String(string(r.scope)))
	}
	_, s := r.t.tracer.Start(r.ctx, spanWait, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(end.Add(-p.Waited)), trace.WithAttributes(attrs...))
	s.End(trace.WithTimestamp(end))
}

// responded records the bucket hash a response named, as the transport
// read it from its headers.
func (r *reqTelemetry) responded(bucket string) {
	if bucket != "" {
		r.bucket = bucket
	}
}

// refused records a request the store did not grant. Errors other than a
// *store.WaitError are the store's failures.
func (r *reqTelemetry) refused(err error) {
	var we *store.WaitError
	if !errors.As(err, &we) {
		r.t.storeError(r.ctx, "acquire")
	}
}

// event records what an [Event] reports: span events, and the 429, retry
// and guard metrics.
func (r *reqTelemetry) event(e *Event) {
	switch e.Kind {
	case EventRateLimited:
		r.scope = e.Scope
		if e.Bucket != "" {
			r.bucket = e.Bucket
		}
		r.count(r.t.limited, attrScope.String(string(e.Scope)))
	case EventRetrying:
		r.resent = e.Attempt
		r.count(r.t.retries, retryReason(e))
		if e.Scope == "" {
			r.scope = "" // a back-off, not a 429's wait
		}
	case EventGuardTripped:
		r.count(r.t.refused, semconv.ErrorTypeKey.String(errorType(e.Err)))
	}
	if !r.rec {
		return
	}
	attrs := make([]attribute.KeyValue, 0, 6)
	if e.Scope != "" {
		attrs = append(attrs, attrScope.String(string(e.Scope)))
	}
	if e.RetryAfter > 0 {
		attrs = append(attrs, attrRetryAfter.Float64(e.RetryAfter.Seconds()))
	}
	if e.Bucket != "" {
		attrs = append(attrs, attrBucket.String(e.Bucket))
	}
	if e.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(e.Status))
	}
	if e.Err != nil {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errorType(e.Err)))
	}
	name := eventGaveUp
	switch e.Kind {
	case EventRateLimited:
		name = eventRateLimited
		attrs = append(attrs, semconv.HTTPRequestResendCount(e.Attempt-1))
	case EventRetrying:
		name = eventRetry
		attrs = append(attrs, semconv.HTTPRequestResendCount(e.Attempt))
	case EventGuardTripped:
		name = eventGuard
	case EventLapsed:
		name = eventLapsed
	}
	r.span.AddEvent(name, trace.WithAttributes(attrs...))
}

// count adds one to a counter of the request's route, with one attribute
// more.
func (r *reqTelemetry) count(c metric.Int64Counter, kv attribute.KeyValue) {
	if c.Enabled(r.ctx) {
		d := r.describe()
		c.Add(r.ctx, 1, metric.WithAttributes(d.tel.method, d.tel.template, kv))
	}
}

// retryReason says why a request is sent again: a 429's scope, or the
// error type of a 5xx or a network error.
func retryReason(e *Event) attribute.KeyValue {
	if e.Scope != "" {
		return attrScope.String(string(e.Scope))
	}
	if e.Err != nil {
		return semconv.ErrorTypeKey.String(errorType(e.Err))
	}
	return semconv.ErrorTypeKey.String(strconv.Itoa(e.Status))
}

// end finishes the request's span with its attributes and outcome.
func (r *reqTelemetry) end(resp *http.Response, err error) {
	if r.span == nil {
		return
	}
	if r.rec {
		d := r.describe()
		host, port := serverAddress(r.url)
		attrs := make([]attribute.KeyValue, 0, 10)
		attrs = append(attrs, d.tel.method, d.tel.template, semconv.ServerAddress(host), semconv.ServerPort(port),
			semconv.URLFull(RedactURL(r.url)), d.tel.route)
		if r.bucket != "" {
			attrs = append(attrs, attrBucket.String(r.bucket))
		}
		if r.resent > 0 {
			attrs = append(attrs, semconv.HTTPRequestResendCount(r.resent))
		}
		errType := ""
		switch {
		case err != nil:
			errType = errorType(err)
		case resp != nil:
			attrs = append(attrs, semconv.HTTPResponseStatusCode(resp.StatusCode))
			if resp.StatusCode >= 400 {
				errType = strconv.Itoa(resp.StatusCode)
			}
		}
		if errType != "" {
			attrs = append(attrs, semconv.ErrorTypeKey.String(errType))
			// The error's text is left out: a network error quotes the
			// URL, token and all.
			r.span.SetStatus(codes.Error, errType)
		}
		r.span.SetAttributes(attrs...)
	}
	r.span.End()
}

// serverAddress returns the host and port a URL names.
func serverAddress(u *url.URL) (string, int) {
	host := u.Hostname()
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err == nil {
			return host, n
		}
	}
	if u.Scheme == "http" {
		return host, 80
	}
	return host, 443
}
