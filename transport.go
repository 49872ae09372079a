package ratecord

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
)

// Transport is an [http.RoundTripper] that keeps the requests sent through
// it inside Discord's rate limits. Create one with [NewTransport]; it is
// safe for concurrent use, and its configuration is fixed once created.
type Transport struct {
	base      http.RoundTripper
	store     store.Store
	gate      store.BlockGate // the store, when it holds Cloudflare blocks
	ownsStore bool
	keyer     *keyer
	cfg       config
	log       *slog.Logger
	tel       *telemetry

	// rtt is the smoothed round trip of the base transport, in
	// nanoseconds: from a request's handing over to its response's
	// headers, seven eighths of the value before and one of the new, as
	// TCP smooths its round trip. 0 until a response came.
	rtt atomic.Int64

	det       *detector // nil unless WithGlobalLimitDetection
	ctx       context.Context
	cancel    context.CancelFunc // cancels ctx, in Close
	closeOnce sync.Once
	done      chan struct{} // closed by Close: releases every waiter

	background sync.WaitGroup // responses read after their callers left (see send)
	bgMu       sync.Mutex     // held while done is closed: orders background.Add before Close's Wait
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport that sends requests through base, nil
// meaning [http.DefaultTransport]. Without [WithStore] it keeps its state in
// a new memory store, which Close closes.
func NewTransport(base http.RoundTripper, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	t := &Transport{
		base:  base,
		store: cfg.store,
		keyer: newKeyer(cfg.hashKey),
		cfg:   cfg,
		log:   cfg.logger,
		done:  make(chan struct{}),
	}
	switch {
	case t.store == nil:
		t.store = memstore.New(memstore.WithPolicy(cfg.policy))
		t.ownsStore = true
	case len(cfg.policyOpts) > 0:
		panic("ratecord: " + strings.Join(cfg.policyOpts, ", ") + " configure the memory store NewTransport creates; " +
			"with WithStore, give the store its policy when building it (memstore.WithPolicy, redisstore.WithPolicy)")
	}
	t.gate, _ = t.store.(store.BlockGate)
	t.tel = newTelemetry(&cfg, t.store, &t.keyer.tmpl)
	t.ctx, t.cancel = context.WithCancel(context.Background())
	if cfg.detect {
		t.det = &detector{bots: make(map[string]detection)}
	}
	return t
}

// Close releases every request waiting for a slot with a [*RateLimitError]
// wrapping [ErrClosed], makes later requests fail the same way, and closes
// the store if the transport created it. Requests already sent finish
// normally, but those whose callers gave up after they were written (see
// [Transport.RoundTrip]) and whose responses have not come are cancelled,
// and reported as sent without an answer, before Close returns. Close
// stops reporting the store's fallbacks to the meter provider. It is
// idempotent and does not close the base transport's connections (see
// [Transport.CloseIdleConnections]).
func (t *Transport) Close() error {
	var err error
	t.closeOnce.Do(func() {
		t.bgMu.Lock() // no background read is counted once done is closed
		close(t.done)
		t.bgMu.Unlock()
		t.cancel()
		t.background.Wait() // their reports reach the store before it closes
		if t.det != nil {
			t.det.close()
		}
		t.tel.close()
		if t.ownsStore {
			err = t.store.Close()
		}
	})
	return err
}

// CloseIdleConnections closes the idle connections of the base transport,
// if it has such a method. [http.Client.CloseIdleConnections] calls it.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// maxLapses is how many lapsed grants (see [store.Reservation.SendBy]) a
// request gives back before it goes on the next one anyway: a store whose
// answers take longer than half its hold would lapse every grant, and the
// request must not claim forever.
const maxLapses = 3

// RoundTrip sends req within the rate limits: it keys the request, claims a
// slot from the store (waiting if it must), sends it, reports what the
// response says back to the store, and sends a 429 again when it may.
//
// It returns a *[RateLimitError] when it gives up before sending. A 429 it
// does not retry (retries used up, or a body it cannot replay) is returned
// as a response, body intact. req is never modified.
//
// When req's context ends while the request is in flight, RoundTrip returns
// the context's error at once. A request the base transport had already
// written (httptrace's WroteRequest; [http.Transport] reports it) counts
// at Discord all the same: it is not cancelled, and its response, when it
// comes (within 30 s), is read in the background and its rate-limit
// headers reported to the store, so that no request goes into the window
// it spent. Its body is then closed, read only as far as a 429's
// retry_after needs.
//
// With telemetry on (see [WithTracerProvider]) the request gets a span,
// which the requests handed to the base transport carry in their context.
func (t *Transport) RoundTrip(req *http.Request) (resp *http.Response, err error) {
	key := t.keyer.key(req, t.cfg.clock.Now)
	ctx, tel := t.tel.start(req, &key) // ctx carries the request's span, if any
	defer func() { tel.end(resp, err) }()
	rc := controlOf(req.Context())
	claim := t.claim(key, req, rc)
	kind, body := kindOf(req, key.route)
	claim.Kind = kind
	if body != nil {
		// The body was read to tell the kind: send a copy of req that
		// carries what was read and the rest.
		req = req.Clone(req.Context())
		req.Body = body
	}
	retries := t.cfg.retries
	if rc.hasRetries {
		retries = rc.retries
	}
	var bo backoff.BackOff

	lapses := 0
	for attempt := 1; ; attempt++ {
		claim.Retry = attempt > 1 || lapses > 0 // a retry keeps its place in line
		tel.queue(+1)
		permit, err := t.acquire(ctx, claim)
		tel.queue(-1)
		if err != nil {
			closeBody(req)
			return nil, t.giveUp(&tel, key, err, attempt)
		}
		tel.acquired(permit)
		bucket := permit.Bucket

		if t.gate != nil && t.gate.Holding(permit) {
			// A Cloudflare block arrived after the grant: this request
			// would meet it. Claim again; the block holds the claim.
			permit.Recycle()
			attempt--
			continue
		}
		// A grant lapses while the process is descheduled or frozen: it
		// is checked here, after every wait of the transport's own, and
		// again by send just before the base transport gets the request.
		recheck := lapses < maxLapses
		if recheck && permit.Lapsed() {
			t.lapse(ctx, &tel, permit, key, attempt)
			attempt--
			lapses++
			continue
		}
		if !recheck && permit.Lapsed() {
			t.log.LogAttrs(ctx, slog.LevelWarn, "ratecord: grant lapsed again; sending on it (the store answers slower than half the global hold)",
				slog.String("route", key.route), slog.String("bucket", bucket), slog.Int("lapses", lapses))
		}
		if t.tooLate(ctx) {
			// Sent now, the request would most likely be cancelled on
			// its way, after Discord counted it: its slot goes to a
			// request that can use it.
			permit.Recycle() // cancels it
			closeBody(req)
			return nil, t.giveUp(&tel, key, &store.WaitError{Bucket: bucket, Err: context.DeadlineExceeded}, attempt)
		}
		out, err := t.prepare(req, attempt)
		if err != nil {
			permit.Recycle() // cancels it
			closeBody(req)
			return nil, err
		}
		sentAt := t.cfg.clock.Now()
		resp, detached, err := t.send(tel.outgoing(out), permit, key, recheck)
		if err == errLapsed {
			// Lapsed between the check above and the hand-off: not sent.
			if out != req {
				closeBody(out)
			}
			t.lapse(ctx, &tel, permit, key, attempt)
			attempt--
			lapses++
			continue
		}
		if detached {
			// The caller left after the request was written: its response
			// is read, and reported, without it.
			return nil, err
		}
		var lim limits
		if err == nil {
			t.observeRTT(t.cfg.clock.Now().Sub(sentAt))
			lim, err = t.readLimits(resp, key) // an error: the body broke off
			if err == nil {
				tel.responded(lim.bucket)
			}
		}
		d := t.decide(req, attempt, retries, resp, err, &lim, &bo)
		t.report(ctx, permit, t.update(true, resp, &lim))
		if lim.scope == store.ScopeBlocked && t.gate != nil {
			// The store times the block now: say how long it holds.
			lim.retryAfter = max(lim.retryAfter, t.gate.BlockedFor(key.route))
			d.wait = max(d.wait, lim.retryAfter)
		}
		if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
			t.rateLimited(ctx, &tel, key, bucket, resp, &lim, attempt)
		}

		e := Event{Route: key.route, Bucket: bucket, Scope: lim.scope, RetryAfter: d.wait, Attempt: attempt, Err: err}
		if resp != nil {
			e.Status = resp.StatusCode
		}
		if !d.retry {
			if d.gaveUp {
				e.Kind = EventGaveUp
				t.event(&tel, e)
			}
			if err != nil {
				if resp != nil {
					resp.Body.Close()
				}
				return nil, err
			}
			return resp, nil
		}
		if resp != nil {
			drain(resp)
		}
		if err := t.sleep(ctx, d.sleep); err != nil {
			return nil, t.interrupted(&tel, key, bucket, d, err, attempt)
		}
		e.Kind = EventRetrying
		t.event(&tel, e)
	}
}

// observeRTT folds the round trip d of one request into the smoothed
// round trip. Concurrent responses may each fold into the same value: the
// estimate stays an estimate.
func (t *Transport) observeRTT(d time.Duration) {
	if d <= 0 {
		return
	}
	old := t.rtt.Load()
	if old == 0 {
		t.rtt.Store(int64(d))
		return
	}
	t.rtt.Store(old + (int64(d)-old)/8)
}

// acquire claims a slot for claim. A request whose context has a
// deadline claims with the deadline by which it must leave to come back in
// time (its deadline less the smoothed round trip, see tooLate): a slot
// that opens later would be given back unused, and the store, told so,
// refuses such a waiter at once when it knows the wait, and never hands
// it a slot that another process's waiter could use. The refusal is the
// deadline's: errors.Is(err, context.DeadlineExceeded).
func (t *Transport) acquire(ctx context.Context, claim store.Claim) (*store.Reservation, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return t.store.Acquire(ctx, claim)
	}
	leave, cancel := context.WithDeadline(ctx, dl.Add(-t.roundTrip()))
	defer cancel()
	return t.store.Acquire(leave, claim)
}

// roundTrip returns the smoothed round trip of the base transport, or
// initialRTT before the first response.
func (t *Transport) roundTrip() time.Duration {
	if rtt := time.Duration(t.rtt.Load()); rtt > 0 {
		return rtt
	}
	return initialRTT
}

// tooLate reports whether the deadline of ctx leaves less than the
// smoothed round trip: a request sent now would likely be cancelled before
// its response came, yet count at Discord (see [WithRequestMaxWait] for
// how deadlines are treated while waiting).
func (t *Transport) tooLate(ctx context.Context) bool {
	dl, ok := ctx.Deadline()
	if !ok {
		return false
	}
	return dl.Sub(t.cfg.clock.Now()) < t.roundTrip()
}

// initialRTT stands for the round trip until a response came. A request
// to Discord's API seldom comes back sooner, whatever the network, so one
// with less left would most likely be cancelled on its way, its slot spent
// for nothing. (A process of many that share a bucket through Redis may be
// granted a slot before it ever heard from Discord; without this it sent
// with a few milliseconds left.) A request with more left goes, and its
// response gives the estimate.
const initialRTT = 40 * time.Millisecond

// decision is what the outcome of one attempt calls for, in the manner of
// go-retryablehttp's CheckRetry and Backoff taken together.
type decision struct {
	retry  bool          // send again
	gaveUp bool          // a failure is returned without retrying it
	wait   time.Duration // how long the limit or back-off lasts, for events
	sleep  time.Duration // how long to sleep before claiming again; 0 when the store times the wait
}

// decide returns what to do after an attempt that ended with resp (its
// limits in lim) or err. A 429 with a retry_after is retried once the store,
// which now knows the wait, grants again; a 429 without one (a block),
// a 5xx or a network error is retried after the request's back-off, when
// the request may be sent again (see WithRetries, WithRetryNonIdempotent). A
// block (a 429 Discord's API did not send) is held by the store when it
// implements store.BlockGate: it pauses the route, or every route, for
// every credential and lets one probe through at a time. With another
// store, the block's back-off is reported as its wait, so no request
// retries in a tight loop.
func (t *Transport) decide(req *http.Request, attempt, retries int, resp *http.Response, err error, lim *limits, bo *backoff.BackOff) decision {
	switch {
	case err != nil && resp != nil:
		return decision{} // the body of a 429 broke off
	case err != nil:
		if !t.retryable(req, attempt, retries) || req.Context().Err() != nil {
			return decision{}
		}
		wait := t.nextWait(bo)
		return decision{retry: wait != backoff.Stop, wait: wait, sleep: wait}
	case resp.StatusCode == http.StatusTooManyRequests:
		if lim.scope == store.ScopeBlocked && t.gate == nil {
			lim.retryAfter = max(lim.retryAfter, t.nextWait(bo))
		}
		if attempt > retries || !replayable(req) {
			return decision{gaveUp: true, wait: lim.retryAfter}
		}
		return decision{retry: true, wait: lim.retryAfter}
	case resp.StatusCode >= 500 && t.retryable(req, attempt, retries):
		wait := t.nextWait(bo)
		return decision{retry: wait != backoff.Stop, wait: wait, sleep: wait}
	}
	return decision{}
}

// claim names the request to the store, with what its context asks (rc).
func (t *Transport) claim(key routeKey, req *http.Request, rc control) store.Claim {
	c := store.Claim{
		Credential: key.credential,
		Route:      key.route,
		Major:      key.major,
		Global:     key.global,
		TokenAuth:  key.tokenAuth,
		MaxWait:    t.cfg.maxWait,
		Priority:   rc.priority,
		Done:       t.done,
		Path:       req.URL.Path,
	}
	if t.cfg.reactions > 0 && isReaction(key.route) {
		c.Spacing = t.cfg.reactions
	}
	if rc.hasMaxWait {
		c.MaxWait, c.NoWait = rc.maxWait, rc.maxWait == 0
	}
	if (len(t.cfg.botLimits) > 0 || t.det != nil) && key.credential != store.Unauthenticated && !key.tokenAuth {
		if id := botID(req.Header.Get("Authorization")); id != "" {
			c.GlobalLimit = t.cfg.botLimits[id]
			if c.GlobalLimit == 0 && t.det != nil {
				c.GlobalLimit = t.detectedLimit(req, id)
			}
		}
	}
	return c
}

// lapse gives back permit, whose grant lapsed before its request could
// leave: the process was descheduled or frozen since (sent now, the request
// might reach Discord after the store stopped counting it, in another
// window than the one it was granted in, or into a pause that began
// meanwhile), or a response since spent its bucket (a 429, a lowered
// limit), which sent now it would meet too. The caller claims again,
// keeping the request's place in line.
func (t *Transport) lapse(ctx context.Context, tel *reqTelemetry, permit *store.Reservation, key routeKey, attempt int) {
	scope := store.ScopeUser
	if permit.Claim.Global {
		scope = store.ScopeGlobal
	}
	t.event(tel, Event{Kind: EventLapsed, Route: key.route, Bucket: permit.Bucket, Scope: scope, Attempt: attempt})
	level, msg := slog.LevelWarn, "ratecord: grant lapsed before the request left; claiming again"
	if t.cfg.clock.Now().Before(permit.SendBy) {
		// Not of age: taken back. Discord changed a limit, or another
		// request met a 429 first; nothing is wrong with this process.
		level, msg = slog.LevelInfo, "ratecord: a response since the grant spent its bucket; claiming again"
	}
	t.log.LogAttrs(ctx, level, msg, slog.String("route", key.route), slog.String("bucket", permit.Bucket))
	permit.Recycle()
}

// prepare returns the request to send for an attempt: req itself the first
// time, a clone with a fresh body afterwards.
func (t *Transport) prepare(req *http.Request, attempt int) (*http.Request, error) {
	if attempt == 1 {
		return req, nil
	}
	out := req.Clone(req.Context())
	if req.Body != nil && req.Body != http.NoBody {
		body, err := req.GetBody()
		if err != nil {
			return nil, err
		}
		out.Body = body
	}
	return out, nil
}

// readLimits parses the rate-limit headers, and for a 429 the body, which
// it puts back so the caller can still read it.
func (t *Transport) readLimits(resp *http.Response, key routeKey) (limits, error) {
	if resp.StatusCode != http.StatusTooManyRequests {
		return parseHeaders(resp.Header), nil
	}
	const maxBody = 64 << 10
	var body []byte
	if resp.Body != nil {
		var err error
		body, err = io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil {
			return parse429(resp.Header, nil, key.legacy), err
		}
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(body), resp.Body), resp.Body}
	}
	return parse429(resp.Header, body, key.legacy), nil
}

type readCloser struct {
	io.Reader
	io.Closer
}

// update turns what happened to a request into a store update.
func (t *Transport) update(sent bool, resp *http.Response, lim *limits) store.Update {
	u := store.Update{Sent: sent}
	if resp == nil || lim == nil {
		return u
	}
	u.Status = resp.StatusCode
	u.Bucket = lim.bucket
	u.HasLimit = lim.hasLimit
	u.Limit, u.Remaining, u.ResetAfter, u.Reset = lim.limit, lim.remaining, lim.resetAfter, lim.reset
	u.Scope, u.RetryAfter, u.Ban = lim.scope, lim.retryAfter, lim.ban
	return u
}

// report settles a reservation with what the response taught, and
// recycles it. A store that fails here does not fail the request: the
// response is still the caller's; the failure is logged.
func (t *Transport) report(ctx context.Context, p *store.Reservation, u store.Update) {
	if err := p.Report(ctx, u); err != nil && !errors.Is(err, store.ErrClosed) {
		t.tel.storeError(ctx, "update")
		t.log.LogAttrs(ctx, slog.LevelError, "ratecord: store update failed",
			slog.String("route", p.Claim.Route), slog.String("bucket", p.Bucket), slog.Any("error", err))
	}
	p.Recycle()
}

// rateLimited reports a 429.
func (t *Transport) rateLimited(ctx context.Context, tel *reqTelemetry, key routeKey, bucket string, resp *http.Response, lim *limits, attempt int) {
	t.event(tel, Event{Kind: EventRateLimited, Route: key.route, Bucket: lim.bucketOr(bucket), Scope: lim.scope, Status: resp.StatusCode, RetryAfter: lim.retryAfter, Attempt: attempt})
	level := slog.LevelWarn
	if lim.scope == store.ScopeShared {
		level = slog.LevelInfo
	}
	t.log.LogAttrs(ctx, level, "ratecord: rate limited",
		slog.String("route", key.route), slog.String("bucket", lim.bucketOr(bucket)),
		slog.String("scope", string(lim.scope)), slog.Duration("retry_after", lim.retryAfter),
		slog.Int("attempt", attempt))
}

func (l *limits) bucketOr(b string) string {
	if l.bucket != "" {
		return l.bucket
	}
	return b
}

// giveUp turns a store refusal into a *RateLimitError and reports it.
func (t *Transport) giveUp(tel *reqTelemetry, key routeKey, err error, attempt int) error {
	tel.refused(err)
	rl := refusal(key.route, err)
	kind, level := EventGaveUp, slog.LevelWarn
	if rl.Scope == store.ScopeGuard {
		kind, level = EventGuardTripped, slog.LevelError
	}
	t.event(tel, Event{Kind: kind, Route: rl.Route, Bucket: rl.Bucket, Scope: rl.Scope, RetryAfter: rl.RetryAfter, Attempt: attempt, Err: rl.Err})
	t.log.LogAttrs(context.Background(), level, "ratecord: gave up",
		slog.String("route", rl.Route), slog.String("bucket", rl.Bucket), slog.String("scope", string(rl.Scope)),
		slog.Duration("retry_after", rl.RetryAfter), slog.Any("error", rl.Err))
	return rl
}

// interrupted reports a wait before a retry that ended early (the context
// ended or the transport closed) the way a wait for a slot that ends so is
// reported: as a *RateLimitError wrapping the reason.
func (t *Transport) interrupted(tel *reqTelemetry, key routeKey, bucket string, d decision, err error, attempt int) error {
	return t.giveUp(tel, key, &store.WaitError{Bucket: bucket, RetryAfter: d.sleep, Err: err}, attempt)
}

// refusal turns a store's refusal of a request on route into a
// *RateLimitError, lifting a *store.WaitError's fields.
func refusal(route string, err error) *RateLimitError {
	rl := &RateLimitError{Route: route, Err: err}
	var we *store.WaitError
	if errors.As(err, &we) {
		rl.Bucket, rl.Scope, rl.RetryAfter, rl.Err = we.Bucket, we.Scope, we.RetryAfter, we.Err
	}
	return rl
}

// event reports e to the request's telemetry and the event handler.
func (t *Transport) event(tel *reqTelemetry, e Event) {
	tel.event(&e)
	if t.cfg.onEvent != nil {
		t.cfg.onEvent(e)
	}
}

// retryable reports whether a 5xx or a network error may be retried.
func (t *Transport) retryable(req *http.Request, attempt, retries int) bool {
	if attempt > retries || !replayable(req) {
		return false
	}
	return t.cfg.retryUnsafe || idempotent(req)
}

// nextWait returns the next back-off interval of the request, starting its
// back-off policy on first use.
func (t *Transport) nextWait(bo *backoff.BackOff) time.Duration {
	if *bo == nil {
		*bo = t.cfg.backoff()
	}
	return (*bo).NextBackOff()
}

// sleep waits d unless ctx ends or the transport closes first, and then
// returns why.
func (t *Transport) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil // the store times the wait
	}
	timer := t.cfg.clock.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.done:
		return ErrClosed
	}
}

func idempotent(req *http.Request) bool {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	_, a := req.Header["Idempotency-Key"]
	_, b := req.Header["X-Idempotency-Key"]
	return a || b
}

// replayable reports whether req's body can be sent again.
func replayable(req *http.Request) bool {
	return req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// drain reads a little of a response body and closes it, so the connection
// can be reused.
func drain(resp *http.Response) {
	io.CopyN(io.Discard, resp.Body, 4<<10)
	resp.Body.Close()
}
