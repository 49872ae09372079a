package ratecord

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	semconv "go.opentelemetry.io/otel/semconv/v1.39.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/ratecord/ratecord/store"
)

// instrumentationName names ratecord's tracer and meter.
const instrumentationName = "github.com/ratecord/ratecord"

// Attributes of the discord.ratelimit namespace, for what the OpenTelemetry
// semantic conventions have no name for.
const (
	// attrRoute is the route key: method and template with ":id"
	// placeholders, as in [RateLimitError.Route] and log records.
	attrRoute = attribute.Key("discord.ratelimit.route")
	// attrBucket is Discord's bucket hash.
	attrBucket = attribute.Key("discord.ratelimit.bucket")
	// attrScope is a 429's scope, or the limit that refused a request.
	attrScope = attribute.Key("discord.ratelimit.scope")
	// attrRetryAfter is how long a 429 or a refusal asked to wait, in
	// seconds.
	attrRetryAfter = attribute.Key("discord.ratelimit.retry_after")
	// attrWaited is how long a request waited for a slot, in seconds.
	attrWaited = attribute.Key("discord.ratelimit.waited")
	// attrStore names the store: its package, e.g. "memstore".
	attrStore = attribute.Key("discord.ratelimit.store")
	// attrStoreOp is the store operation that failed: "acquire" or "update".
	attrStoreOp = attribute.Key("discord.ratelimit.store.operation")
)

// Names of span events and child spans.
const (
	spanWait         = "ratecord.wait"
	eventRateLimited = "ratecord.rate_limited"
	eventRetry       = "ratecord.retry"
	eventGaveUp      = "ratecord.gave_up"
	eventGuard       = "ratecord.guard_tripped"
	eventStoreError  = "ratecord.store_error"
)

// redacted replaces webhook and interaction tokens in telemetry.
const redacted = "REDACTED"

// FallbackCounter is implemented by a store that can switch to a local
// limiter while its shared backend is unreachable. Fallbacks returns how
// many times it switched since it was created, and must be safe for
// concurrent use. A [Transport] whose store implements
// FallbackCounter reports the count as the discord.ratelimit.store.fallbacks
// metric; transports that share such a store under one meter provider each
// report the store's whole count.
type FallbackCounter interface {
	Fallbacks() uint64
}

// WithTracerProvider sets where the transport's spans go. Without it the
// global provider ([otel.GetTracerProvider]) is used: the one set when
// [NewTransport] is called or, if none was set yet, the first one set
// later. A nil tp is ignored.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) {
		if tp != nil {
			c.tracerProvider = tp
		}
	})
}

// WithMeterProvider sets where the transport's metrics go. Without it the
// global provider ([otel.GetMeterProvider]) is used: the one set when
// [NewTransport] is called or, if none was set yet, the first one set
// later. A nil mp is ignored.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.meterProvider = mp
		}
	})
}

// WithPropagation makes the transport write the request's trace context
// into the headers sent to Discord, with the global propagator
// ([otel.GetTextMapPropagator]). It is off by default: Discord has no use
// for trace headers.
func WithPropagation(on bool) Option {
	return optionFunc(func(c *config) { c.propagate = on })
}

// telemetry holds a transport's tracer and instruments. It is fixed once
// created.
type telemetry struct {
	tracer trace.Tracer // nil: tracing off
	// globalDefault is the global tracer provider as it was when the
	// transport was created, if that was OpenTelemetry's placeholder: no
	// span is started while it still is.
	globalDefault trace.TracerProvider
	propagate     bool
	store         attribute.KeyValue

	wait      metric.Float64Histogram
	limited   metric.Int64Counter
	retries   metric.Int64Counter
	queued    metric.Int64UpDownCounter
	storeErrs metric.Int64Counter
	refused   metric.Int64Counter
	fallbacks metric.Int64ObservableCounter
	reg       metric.Registration // of the fallbacks callback, or nil

	routes routeNames
}

// Metric names, with their units in newTelemetry.
const (
	metricWait      = "discord.ratelimit.wait.duration"
	metricLimited   = "discord.ratelimit.rate_limited"
	metricRetries   = "discord.ratelimit.retries"
	metricQueued    = "discord.ratelimit.queued"
	metricStoreErrs = "discord.ratelimit.store.errors"
	metricFallbacks = "discord.ratelimit.store.fallbacks"
	metricRefused   = "discord.ratelimit.guard.refusals"
)

// waitBuckets are the histogram boundaries of waits, in seconds: from
// "went at once" to Discord's longest usual resets.
var waitBuckets = []float64{0, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func newTelemetry(cfg *config, s store.Store) *telemetry {
	t := &telemetry{propagate: cfg.propagate, store: attrStore.String(storeName(s))}

	tp := cfg.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
		if isGlobalPlaceholder(tp) {
			t.globalDefault = tp
		}
	}
	if _, off := tp.(tracenoop.TracerProvider); !off {
		t.tracer = tp.Tracer(instrumentationName, trace.WithSchemaURL(semconv.SchemaURL))
	}

	mp := cfg.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentationName, metric.WithSchemaURL(semconv.SchemaURL))
	var noop metricnoop.Meter
	var err error
	if t.wait, err = m.Float64Histogram(metricWait, metric.WithUnit("s"),
		metric.WithDescription("Time requests waited for a slot."),
		metric.WithExplicitBucketBoundaries(waitBuckets...)); err != nil {
		otel.Handle(err)
		t.wait, _ = noop.Float64Histogram(metricWait)
	}
	if t.limited, err = m.Int64Counter(metricLimited, metric.WithUnit("{response}"),
		metric.WithDescription("429 responses from Discord, by scope.")); err != nil {
		otel.Handle(err)
		t.limited, _ = noop.Int64Counter(metricLimited)
	}
	if t.retries, err = m.Int64Counter(metricRetries, metric.WithUnit("{retry}"),
		metric.WithDescription("Requests sent again after a 429, a 5xx or a network error.")); err != nil {
		otel.Handle(err)
		t.retries, _ = noop.Int64Counter(metricRetries)
	}
	if t.queued, err = m.Int64UpDownCounter(metricQueued, metric.WithUnit("{fallback}"),
		metric.WithDescription("Requests waiting for a slot.")); err != nil {
		otel.Handle(err)
		t.queued, _ = noop.Int64UpDownCounter(metricQueued)
	}
	if t.storeErrs, err = m.Int64Counter(metricStoreErrs, metric.WithUnit("{error}"),
		metric.WithDescription("Store operations that failed.")); err != nil {
		otel.Handle(err)
		t.storeErrs, _ = noop.Int64Counter(metricStoreErrs)
	}
	if t.refused, err = m.Int64Counter(metricRefused, metric.WithUnit("{request}"),
		metric.WithDescription("Requests refused by the invalid-request guard or a 401/404 cooldown.")); err != nil {
		otel.Handle(err)
		t.refused, _ = noop.Int64Counter(metricRefused)
	}
	if t.fallbacks, err = m.Int64ObservableCounter(metricFallbacks, metric.WithUnit("{fallback}"),
		metric.WithDescription("Times a store switched to its local limiter because its backend failed.")); err != nil {
		otel.Handle(err)
		t.fallbacks, _ = noop.Int64ObservableCounter(metricFallbacks)
	}
	if fc, ok := s.(FallbackCounter); ok {
		opt := metric.WithAttributeSet(attribute.NewSet(t.store))
		t.reg, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
			o.ObserveInt64(t.fallbacks, int64(fc.Fallbacks()), opt)
			return nil
		}, t.fallbacks)
		if err != nil {
			otel.Handle(err)
		}
	}
	return t
}

// close unregisters the fallbacks callback.
func (t *telemetry) close() {
	if t.reg != nil {
		if err := t.reg.Unregister(); err != nil {
			otel.Handle(err)
		}
	}
}

// tracing reports whether spans are to be started.
func (t *telemetry) tracing() bool {
	if t.tracer == nil {
		return false
	}
	// Until a provider is set, the global one records nothing, and starting
	// spans from it would cost allocations for nothing.
	return t.globalDefault == nil || otel.GetTracerProvider() != t.globalDefault
}

// isGlobalPlaceholder reports whether tp is the provider OpenTelemetry
// returns before SetTracerProvider is called: it forwards to the provider
// set later, and records nothing until then.
func isGlobalPlaceholder(tp trace.TracerProvider) bool {
	typ := reflect.TypeOf(tp)
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	return typ.PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// storeName returns the name of the package that defines s's type.
func storeName(s store.Store) string {
	typ := reflect.TypeOf(s)
	if typ == nil {
		return "unknown"
	}
	if typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	p := typ.PkgPath()
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if p == "" {
		return typ.String()
	}
	return p
}

// reqTelemetry follows one request through RoundTrip: its span, if any,
// and its metrics. With telemetry off every method returns at once and
// nothing is allocated.
type reqTelemetry struct {
	t      *telemetry
	ctx    context.Context // carries span
	route  string          // the route key's route
	names  *routeName      // nil until needed
	span   trace.Span      // nil when no span was started
	rec    bool            // span is recording
	bucket string          // the last bucket hash learned
	scope  store.Scope     // the last 429's scope: what the next wait is for
	resent int             // times the request was sent again
}

// start begins a request's telemetry. The context it returns carries the
// request's span, if one was started.
func (t *telemetry) start(req *http.Request, key *routeKey) (context.Context, reqTelemetry) {
	r := reqTelemetry{t: t, ctx: req.Context(), route: key.route}
	if !t.tracing() {
		return r.ctx, r
	}
	n := r.name()
	host, port := serverAddress(req.URL)
	r.ctx, r.span = t.tracer.Start(r.ctx, n.span, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		n.methodAttr,
		n.templateAttr,
		semconv.ServerAddress(host),
		semconv.ServerPort(port),
		semconv.URLFull(RedactURL(req.URL)),
		attrRoute.String(key.route),
	))
	r.rec = r.span.IsRecording()
	return r.ctx, r
}

// name returns the request's route names, computing them once.
func (r *reqTelemetry) name() *routeName {
	if r.names == nil {
		r.names = r.t.routes.get(r.route)
	}
	return r.names
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
		r.t.queued.Add(r.ctx, n, r.name().add...)
	}
}

// acquired records a granted slot: how long it took, and a child span for
// a wait.
func (r *reqTelemetry) acquired(p *store.Reservation) {
	r.bucket = p.Bucket
	if r.t.wait.Enabled(r.ctx) {
		r.t.wait.Record(r.ctx, p.Waited.Seconds(), r.name().rec...)
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

// refused records a request the store did not grant. Errors other than a
// *store.WaitError are the store's failures.
func (r *reqTelemetry) refused(err error) {
	var we *store.WaitError
	if !errors.As(err, &we) {
		r.t.storeError(r.ctx, "acquire")
	}
}

// storeError counts a failed store operation, and adds an event to the
// span in ctx. The error itself is not recorded: it may quote anything.
func (t *telemetry) storeError(ctx context.Context, op string) {
	if t.storeErrs.Enabled(ctx) {
		t.storeErrs.Add(ctx, 1, metric.WithAttributes(t.store, attrStoreOp.String(op)))
	}
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(eventStoreError, trace.WithAttributes(t.store, attrStoreOp.String(op)))
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
		if r.t.limited.Enabled(r.ctx) {
			n := r.name()
			r.t.limited.Add(r.ctx, 1, metric.WithAttributes(n.methodAttr, n.templateAttr, attrScope.String(string(e.Scope))))
		}
	case EventRetrying:
		r.resent = e.Attempt
		if r.t.retries.Enabled(r.ctx) {
			n := r.name()
			r.t.retries.Add(r.ctx, 1, metric.WithAttributes(n.methodAttr, n.templateAttr, retryReason(e)))
		}
		if e.Scope == "" {
			r.scope = "" // a back-off, not a 429's wait
		}
	case EventGuardTripped:
		if r.t.refused.Enabled(r.ctx) {
			n := r.name()
			r.t.refused.Add(r.ctx, 1, metric.WithAttributes(n.methodAttr, n.templateAttr, semconv.ErrorTypeKey.String(errorType(e.Err))))
		}
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
	}
	r.span.AddEvent(name, trace.WithAttributes(attrs...))
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

// end finishes the request's span with its outcome.
func (r *reqTelemetry) end(resp *http.Response, err error) {
	if r.span == nil {
		return
	}
	if r.rec {
		attrs := make([]attribute.KeyValue, 0, 4)
		if resp != nil {
			if b := parseBucket(first(resp.Header, hdrBucket)); b != "" {
				r.bucket = b
			}
		}
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

// errorType names an error for error.type without quoting it: the
// ratecord reason it wraps, or its Go type.
func errorType(err error) string {
	switch {
	case errors.Is(err, ErrWaitTooLong):
		return "wait_too_long"
	case errors.Is(err, ErrInvalidBudget):
		return "invalid_budget"
	case errors.Is(err, ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, ErrWebhookGone):
		return "webhook_gone"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline_exceeded"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	var rl *RateLimitError
	if errors.As(err, &rl) && rl.Err != nil {
		err = rl.Err
	}
	return fmt.Sprintf("%T", err)
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

// RedactURL returns u as a string fit for logs and telemetry: webhook and
// interaction tokens in the path (the segment after webhooks/{id} or
// interactions/{id}, and any segment of 40 bytes or more) are replaced by
// "REDACTED", and user information and the fragment are dropped. A nil u
// gives "". It is safe for concurrent use.
//
// Use it to clean url.full in the spans of an instrumented base transport
// such as otelhttp, which records the URL as it is.
func RedactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	var b strings.Builder
	if u.Scheme != "" {
		b.WriteString(u.Scheme)
		b.WriteByte(':')
	}
	if u.Host != "" || u.Scheme != "" {
		b.WriteString("//")
		b.WriteString(u.Host)
	}
	path := u.EscapedPath()
	var prev, prev2 string
	for i := 0; i < len(path); {
		if path[i] == '/' {
			b.WriteByte('/')
			i++
			continue
		}
		end := strings.IndexByte(path[i:], '/')
		if end < 0 {
			end = len(path)
		} else {
			end += i
		}
		seg := path[i:end]
		if len(seg) >= 40 || (prev2 == "webhooks" || prev2 == "interactions") && isDigits(prev) {
			b.WriteString(redacted)
		} else {
			b.WriteString(seg)
		}
		prev2, prev = prev, seg
		i = end
	}
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteByte('?')
		b.WriteString(u.RawQuery)
	}
	return b.String()
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// routeName is a route key in the form telemetry wants.
type routeName struct {
	method       string
	template     string // "/channels/{channel_id}/messages"
	span         string // "POST /channels/{channel_id}/messages"
	methodAttr   attribute.KeyValue
	templateAttr attribute.KeyValue
	add          []metric.AddOption
	rec          []metric.RecordOption
}

// routeNames caches routeName by route key. Readers load an immutable map;
// a new route copies it. Route keys are few, and the cache stops growing at
// maxTemplates.
type routeNames struct {
	m  atomic.Pointer[map[string]*routeName]
	mu sync.Mutex // serializes writers
}

func (c *routeNames) get(route string) *routeName {
	if m := c.m.Load(); m != nil {
		if n, ok := (*m)[route]; ok {
			return n
		}
	}
	n := newRouteName(route)
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.m.Load()
	if old != nil && len(*old) >= maxTemplates {
		return n
	}
	m := make(map[string]*routeName, 1+lenOfNames(old))
	if old != nil {
		for k, v := range *old {
			m[k] = v
		}
	}
	m[route] = n
	c.m.Store(&m)
	return n
}

func lenOfNames(m *map[string]*routeName) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

func newRouteName(route string) *routeName {
	method, tmpl := namedRoute(route)
	n := &routeName{
		method:       method,
		template:     tmpl,
		span:         method + " " + tmpl,
		methodAttr:   semconv.HTTPRequestMethodKey.String(method),
		templateAttr: semconv.URLTemplate(tmpl),
	}
	opt := metric.WithAttributeSet(attribute.NewSet(n.methodAttr, n.templateAttr))
	n.add = []metric.AddOption{opt}
	n.rec = []metric.RecordOption{opt}
	return n
}

// namedRoute turns a route key ("POST /channels/:id/messages/:id#old")
// into its method and an OpenTelemetry URL template
// ("/channels/{channel_id}/messages/{message_id}").
func namedRoute(route string) (method, tmpl string) {
	route = strings.TrimSuffix(route, oldMessageSuffix)
	method, path, ok := strings.Cut(route, " ")
	if !ok {
		return "", route
	}
	segs := strings.Split(path, "/")
	for i, s := range segs {
		switch s {
		case ":id":
			segs[i] = "{id}"
			if i > 0 {
				segs[i] = idName(segs[i-1])
			}
		case ":token":
			segs[i] = "{token}"
			if i > 1 {
				switch segs[i-2] {
				case "webhooks":
					segs[i] = "{webhook_token}"
				case "interactions":
					segs[i] = "{interaction_token}"
				}
			}
		case ":reaction":
			segs[i] = "{emoji}"
		case ":code":
			segs[i] = "{code}"
		}
	}
	return method, strings.Join(segs, "/")
}

// idName names the id that follows a route word.
func idName(word string) string {
	switch word {
	case "channels":
		return "{channel_id}"
	case "guilds":
		return "{guild_id}"
	case "messages":
		return "{message_id}"
	case "webhooks":
		return "{webhook_id}"
	case "interactions":
		return "{interaction_id}"
	case "users", "members":
		return "{user_id}"
	case "roles":
		return "{role_id}"
	case "emojis":
		return "{emoji_id}"
	case "applications":
		return "{application_id}"
	case "commands":
		return "{command_id}"
	}
	return "{id}"
}
