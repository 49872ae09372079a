package ratecord

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
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
	attrRoute attribute.Key = "discord.ratelimit.route"
	// attrBucket is Discord's bucket hash.
	attrBucket attribute.Key = "discord.ratelimit.bucket"
	// attrScope is a 429's scope, or the limit that refused a request.
	attrScope attribute.Key = "discord.ratelimit.scope"
	// attrRetryAfter is how long a 429 or a refusal asked to wait, in
	// seconds.
	attrRetryAfter attribute.Key = "discord.ratelimit.retry_after"
	// attrWaited is how long a request waited for a slot, in seconds.
	attrWaited attribute.Key = "discord.ratelimit.waited"
	// attrStore names the store: its package, e.g. "memstore".
	attrStore attribute.Key = "discord.ratelimit.store"
	// attrStoreOp is the store operation that failed: "acquire" or "update".
	attrStoreOp attribute.Key = "discord.ratelimit.store.operation"
)

// Names of span events and child spans.
const (
	spanWait         = "ratecord.wait"
	eventRateLimited = "ratecord.rate_limited"
	eventRetry       = "ratecord.retry"
	eventGaveUp      = "ratecord.gave_up"
	eventGuard       = "ratecord.guard_tripped"
	eventStoreError  = "ratecord.store_error"
	eventLapsed      = "ratecord.grant_lapsed"
)

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
// created but for idle.
type telemetry struct {
	tracer    trace.Tracer // nil: tracing off
	startOpts []trace.SpanStartOption
	// global is the global tracer provider tracer came from, or nil when
	// WithTracerProvider chose one. idle is set once a request found that
	// it makes no spans of its own (OpenTelemetry's placeholder before a
	// provider is set, or a no-op): no span is started while it is still
	// the global provider.
	global    trace.TracerProvider
	idle      atomic.Bool
	propagate bool
	store     attribute.KeyValue
	routes    *templates // the keyer's: route descriptors by route key

	wait      metric.Float64Histogram
	limited   metric.Int64Counter
	retries   metric.Int64Counter
	queued    metric.Int64UpDownCounter
	storeErrs metric.Int64Counter
	refused   metric.Int64Counter
	fallbacks metric.Int64ObservableCounter
	reg       metric.Registration // of the fallbacks callback, or nil
}

func newTelemetry(cfg *config, s store.Store, routes *templates) *telemetry {
	t := &telemetry{
		propagate: cfg.propagate,
		store:     attrStore.String(storeName(s)),
		routes:    routes,
		startOpts: []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)},
	}

	tp := cfg.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
		t.global = tp
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
	counter := func(name, unit, desc string) metric.Int64Counter {
		return instrument[metric.Int64Counter, metric.Int64CounterOption](m.Int64Counter, noop.Int64Counter,
			name, metric.WithUnit(unit), metric.WithDescription(desc))
	}
	t.limited = counter(metricLimited, "{response}", "429 responses from Discord, by scope.")
	t.retries = counter(metricRetries, "{retry}", "Requests sent again after a 429, a 5xx or a network error.")
	t.storeErrs = counter(metricStoreErrs, "{error}", "Store operations that failed.")
	t.refused = counter(metricRefused, "{request}", "Requests refused by the invalid-request guard or a 401/404 cooldown.")
	t.wait = instrument[metric.Float64Histogram, metric.Float64HistogramOption](m.Float64Histogram, noop.Float64Histogram,
		metricWait, metric.WithUnit("s"), metric.WithDescription("Time requests waited for a slot."),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	t.queued = instrument[metric.Int64UpDownCounter, metric.Int64UpDownCounterOption](m.Int64UpDownCounter, noop.Int64UpDownCounter,
		metricQueued, metric.WithUnit("{request}"), metric.WithDescription("Requests waiting for a slot."))
	t.fallbacks = instrument[metric.Int64ObservableCounter, metric.Int64ObservableCounterOption](m.Int64ObservableCounter,
		noop.Int64ObservableCounter, metricFallbacks, metric.WithUnit("{fallback}"),
		metric.WithDescription("Times a store switched to its local limiter because its backend failed."))
	if fc, ok := s.(FallbackCounter); ok {
		opt := metric.WithAttributeSet(attribute.NewSet(t.store))
		var err error
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

// instrument creates an instrument with create. If the meter fails, it
// reports the error to OpenTelemetry's handler and returns the no-op
// instrument that fallback creates, so the request path never meets a nil
// one.
func instrument[I, O any](create, fallback func(string, ...O) (I, error), name string, opts ...O) I {
	i, err := create(name, opts...)
	if err != nil {
		otel.Handle(err)
		i, _ = fallback(name)
	}
	return i
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
	return !t.idle.Load() || otel.GetTracerProvider() != t.global
}

// learn marks the global provider idle when span, started under parent,
// is no span of its own: not recording, and with the parent's span id
// (none, or the caller's). Providers of a type that cannot be compared
// are never marked, so that tracing's comparison cannot panic.
func (t *telemetry) learn(span trace.Span, parent trace.SpanContext) {
	if t.global == nil || t.idle.Load() || span.IsRecording() || span.SpanContext().SpanID() != parent.SpanID() {
		return
	}
	if canCompare(t.global) && otel.GetTracerProvider() == t.global {
		t.idle.Store(true)
	}
}

// canCompare reports whether v can be compared with ==: false when its
// dynamic type holds a slice, a map or a func.
func canCompare(v any) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return v == v
}

// storeName names a store for the discord.ratelimit.store attribute: the
// package of its type, e.g. "memstore" for a *memstore.Store.
func storeName(s store.Store) string {
	name := strings.TrimLeft(fmt.Sprintf("%T", s), "*")
	if pkg, _, ok := strings.Cut(name, "."); ok && pkg != "" {
		return pkg
	}
	return name
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

// routeTelemetry is what telemetry says of a route, computed once per
// route descriptor.
type routeTelemetry struct {
	method, template, route attribute.KeyValue
	add                     []metric.AddOption    // method and template
	rec                     []metric.RecordOption // method and template
}

func newRouteTelemetry(r *route) routeTelemetry {
	rt := routeTelemetry{
		method:   semconv.HTTPRequestMethodKey.String(r.method),
		template: semconv.URLTemplate(r.template),
		route:    attrRoute.String(r.key),
	}
	opt := metric.WithAttributeSet(attribute.NewSet(rt.method, rt.template))
	rt.add = []metric.AddOption{opt}
	rt.rec = []metric.RecordOption{opt}
	return rt
}

// errorType names an error for error.type without quoting it: the
// ratecord reason it wraps, or its Go type.
func errorType(err error) string {
	if r := Reason(err); r != "" {
		return r
	}
	var rl *RateLimitError
	if errors.As(err, &rl) && rl.Err != nil {
		err = rl.Err
	}
	return fmt.Sprintf("%T", err)
}
