package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// Run runs the conformance suite against the stores that newStore returns.
//
// newStore must return a store that applies policy p. Each subtest calls it
// at least once and closes the stores it gets with t.Cleanup (Close must
// therefore be idempotent, as the contract says).
// Subtests use credentials of their own, unique to one call of Run, so a
// store backed by a shared server needs no cleaning between runs. The
// invalid-request guard is the exception: it counts for the whole store, so
// newStore must return a store whose invalid-request count starts at zero
// (for a shared server, a fresh key prefix).
//
// Subtests whose checks read the wall clock closely run one at a time;
// the others call t.Parallel and so run together once the calling test
// function returns.
func Run(t *testing.T, newStore func(t *testing.T, p store.Policy) store.Store) {
	nonce := time.Now().UnixNano()
	for _, tc := range cases() {
		t.Run(tc.name, func(t *testing.T) {
			if !tc.serial {
				t.Parallel()
			}
			tc.run(newHarness(t, newStore, nonce, tc.policy))
		})
	}
}

// testCase is one subtest of Run.
type testCase struct {
	name   string
	serial bool         // runs alone: its checks are sensitive to scheduling delays
	policy store.Policy // of the subtest's first store
	run    func(h *harness)
}

// cases returns the subtests of Run.
func cases() []testCase {
	return []testCase{
		{name: "UnknownRoute", run: testUnknownRoute},
		{name: "QueuedFollowLearnedBucket", run: testQueuedFollowLearnedBucket},
		{name: "ProbePerMajor", run: testProbePerMajor},
		{name: "RemainingCountsGrants", run: testRemainingCountsGrants},
		{name: "SharedHashPerMajor", run: testSharedHashPerMajor},
		{name: "ProbeKeepsSlot", policy: store.Policy{GlobalHold: 2 * time.Second}, run: testProbeKeepsSlot},
		{name: "NoBucketRoute", run: testNoBucketRoute},
		{name: "StaleRemaining", run: testStaleRemaining},
		{name: "ResetOnlyMovesLater", run: testResetOnlyMovesLater},
		{name: "UnknownResetAfter", run: testUnknownResetAfter},
		{name: "LimitRaised", run: testLimitRaised},
		{name: "LimitLowered", run: testLimitLowered},
		{name: "SpentRecallsGrants", run: testSpentRecallsGrants},
		{name: "LoweredRecallsGrants", policy: store.Policy{GlobalHold: 2 * time.Second}, run: testLoweredRecallsGrants},
		{name: "FIFO", serial: true, run: testFIFO},
		{name: "Priority", serial: true, run: testPriority},
		{name: "RetryKeepsPlace", serial: true, policy: store.Policy{ResetOffset: 20 * time.Millisecond}, run: testRetryKeepsPlace},
		{name: "CancelWaiter", run: testCancelWaiter},
		{name: "CancelGivesBackSlot", policy: store.Policy{GlobalWindow: far}, run: testCancelGivesBackSlot},
		{name: "DeadlineBeforeKnownWait", run: testDeadlineBeforeKnownWait},
		{name: "DeadlineBehindGrant", run: testDeadlineBehindGrant},
		{name: "MaxWaitBeforeKnownWait", run: testMaxWaitBeforeKnownWait},
		{name: "DeadlineDuringUnknownWait", run: testDeadlineDuringUnknownWait},
		{name: "GlobalBurst", policy: store.Policy{GlobalWindow: far}, run: testGlobalBurst},
		{name: "GlobalSlidingWindow", serial: true, policy: store.Policy{GlobalWindow: slidingWindow}, run: testGlobalSlidingWindow},
		{name: "Global429", policy: store.Policy{ResetOffset: 50 * time.Millisecond}, run: testGlobal429},
		{name: "User429", policy: store.Policy{ResetOffset: 50 * time.Millisecond}, run: testUser429},
		{name: "LearnedLimit", policy: store.Policy{ResetOffset: 20 * time.Millisecond}, run: testLearnedLimit},
		{name: "Spacing", run: testSpacing},
		{name: "HiddenSublimit", policy: store.Policy{ResetOffset: 10 * time.Millisecond}, run: testHiddenSublimit},
		{name: "KindOneAtATime", run: testKindOneAtATime},
		{name: "Shared429", run: testShared429},
		{name: "Shared429Uncounted", run: testShared429Uncounted},
		{name: "Blocked429", run: testBlocked429},
		{name: "BlockedBan", run: testBlockedBan},
		{name: "BlockPaces", serial: true, run: testBlockPaces},
		{name: "UnsentGivesBackSlot", run: testUnsentGivesBackSlot},
		{name: "UnansweredKeepsWindow", run: testUnansweredKeepsWindow},
		{name: "UnsentGivesBackGlobalSlot", policy: store.Policy{GlobalWindow: far}, run: testUnsentGivesBackGlobalSlot},
		{name: "SettleOnce", run: testSettleOnce},
		{name: "NoWait", run: testNoWait},
		{name: "Estimate", policy: store.Policy{GlobalWindow: far}, run: testEstimate},
		{name: "InvalidBudget", policy: store.Policy{InvalidBudget: 3, Cooldown: -1}, run: testInvalidBudget},
		{name: "Unauthorized", policy: store.Policy{Cooldown: time.Hour}, run: testUnauthorized},
		{name: "WebhookGone", policy: store.Policy{Cooldown: time.Hour}, run: testWebhookGone},
		{name: "Close", policy: store.Policy{GlobalWindow: far}, run: testClose},
		{name: "ClaimDone", run: testClaimDone},
		{name: "Hammer", serial: true, policy: store.Policy{ResetOffset: 2 * time.Millisecond}, run: testHammer},
	}
}

const (
	// slack absorbs clock granularity in lower bounds: a store may keep time
	// in milliseconds, or read another clock than the test (Redis TIME).
	slack = 5 * time.Millisecond
	// eventually bounds what must happen at some point, generously.
	eventually = 10 * time.Second
	// atOnce bounds an Acquire that must not wait for any reset; the resets
	// that would delay it lie further away.
	atOnce = 2 * time.Second
	// watch is how long a request is watched to make sure it keeps waiting.
	watch = 150 * time.Millisecond
	// far is a reset that no subtest waits for.
	far = 30 * time.Second
	// slidingWindow is the global window of GlobalSlidingWindow.
	slidingWindow = 300 * time.Millisecond
)

// Routes and majors used by the subtests.
const (
	routeCreate = "POST /channels/:id/messages"
	routeList   = "GET /channels/:id/messages"
	routeEdit   = "PATCH /channels/:id/messages/:id"
	routeMe     = "GET /users/@me"
	routeHook   = "POST /webhooks/:id/:token"
	routeChan   = "PATCH /channels/:id"
	major1      = "channels/1"
	major2      = "channels/2"
	major3      = "channels/3"
)

// harness holds one subtest's store and helpers around it.
type harness struct {
	t        *testing.T
	s        store.Store
	nonce    int64
	newStore func(t *testing.T, p store.Policy) store.Store
}

func newHarness(t *testing.T, newStore func(t *testing.T, p store.Policy) store.Store, nonce int64, p store.Policy) *harness {
	s := newStore(t, p)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v; want nil", err)
		}
	})
	return &harness{t: t, s: s, nonce: nonce, newStore: newStore}
}

// with returns a harness of the same subtest on a new store with policy p.
func (h *harness) with(p store.Policy) *harness {
	return newHarness(h.t, h.newStore, h.nonce, p)
}

// cred returns a credential unique to this subtest, this run and label.
func (h *harness) cred(label string) string {
	return fmt.Sprintf("storetest/%d/%s/%s", h.nonce, h.t.Name(), label)
}

func claim(cred, route, major string) store.Claim {
	return store.Claim{Credential: cred, Route: route, Major: major}
}

func describe(c store.Claim) string {
	s := c.Route
	if c.Major != "" {
		s += " [" + c.Major + "]"
	}
	if c.Global {
		s += " (global)"
	}
	return s
}

// response returns a sent Update with status and no rate-limit headers.
func response(c store.Claim, status int) store.Update {
	return store.Update{Sent: true, Status: status}
}

// limits returns a 200 response carrying rate-limit headers.
func limits(c store.Claim, bucket string, limit, remaining int, resetAfter time.Duration) store.Update {
	u := response(c, 200)
	u.Bucket = bucket
	u.HasLimit = true
	u.Limit = limit
	u.Remaining = remaining
	u.ResetAfter = resetAfter
	return u
}

// unsent returns the Update of a request that never left the process.
func unsent(c store.Claim) store.Update {
	u := response(c, 0)
	u.Sent = false
	return u
}

// tooMany returns a 429 response of scope with retry.
func tooMany(c store.Claim, scope store.Scope, retry time.Duration) store.Update {
	u := response(c, 429)
	u.Scope = scope
	u.RetryAfter = retry
	return u
}

// acquireNow acquires a permit that the store must grant without waiting for
// a reset or a pause.
func (h *harness) acquireNow(c store.Claim) *store.Reservation {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
	defer cancel()
	p, err := h.s.Acquire(ctx, c)
	if err != nil {
		h.t.Fatalf("Acquire(%s) = %v; want a permit at once", describe(c), err)
	}
	return p
}

func (h *harness) update(p *store.Reservation, u store.Update) {
	h.t.Helper()
	if err := p.Report(h.t.Context(), u); err != nil {
		h.t.Fatalf("Report(%s, status %d) = %v; want nil", describe(p.Claim), u.Status, err)
	}
}

// learn sends one request on c and reports a response naming bucket.
func (h *harness) learn(c store.Claim, bucket string, limit, remaining int, resetAfter time.Duration) {
	h.t.Helper()
	p := h.acquireNow(c)
	h.update(p, limits(c, bucket, limit, remaining, resetAfter))
}

// mustWait asserts that c is not granted within d and returns the error of
// Acquire, which must wrap context.DeadlineExceeded.
func (h *harness) mustWait(c store.Claim, d time.Duration) error {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(h.t.Context(), d)
	defer cancel()
	p, err := h.s.Acquire(ctx, c)
	if err == nil {
		h.t.Errorf("Acquire(%s) granted a permit; want it to wait longer than %v", describe(c), d)
		h.update(p, unsent(c))
		return nil
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		h.t.Errorf("Acquire(%s) = %v; want an error wrapping context.DeadlineExceeded", describe(c), err)
	}
	var we *store.WaitError
	if !errors.As(err, &we) {
		h.t.Errorf("Acquire(%s) = %T; want a *store.WaitError", describe(c), err)
	}
	return err
}

// result is what an asynchronous Acquire returned, and when.
type result struct {
	p   *store.Reservation
	err error
	at  time.Time
}

// acquireAsync runs Acquire in a goroutine that ends when Acquire returns;
// the subtest's context ends it at the latest.
func (h *harness) acquireAsync(ctx context.Context, c store.Claim) <-chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := h.s.Acquire(ctx, c)
		ch <- result{p: p, err: err, at: time.Now()}
	}()
	return ch
}

// queue starts an Acquire and gives it time to join the queue.
func (h *harness) queue(ctx context.Context, c store.Claim) <-chan result {
	ch := h.acquireAsync(ctx, c)
	time.Sleep(30 * time.Millisecond)
	return ch
}

// await waits for an asynchronous Acquire to return.
func (h *harness) await(ch <-chan result, what string) result {
	h.t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(eventually):
		h.t.Fatalf("%s: Acquire still blocked after %v", what, eventually)
		return result{}
	}
}

// granted waits for an asynchronous Acquire that must succeed.
func (h *harness) granted(ch <-chan result, what string) result {
	h.t.Helper()
	r := h.await(ch, what)
	if r.err != nil {
		h.t.Fatalf("%s: Acquire = %v; want a permit", what, r.err)
	}
	return r
}

// stillWaiting asserts that an asynchronous Acquire does not return within d.
// When it does, the result is put back for a later await.
func (h *harness) stillWaiting(ch <-chan result, d time.Duration, what string) <-chan result {
	h.t.Helper()
	select {
	case r := <-ch:
		h.t.Errorf("%s: Acquire returned (permit %+v, error %v); want it still waiting", what, r.p, r.err)
		back := make(chan result, 1)
		back <- r
		return back
	case <-time.After(d):
		return ch
	}
}

// notBefore asserts that r came at least d after t0.
func (h *harness) notBefore(r result, t0 time.Time, d time.Duration, what string) {
	h.t.Helper()
	if got := r.at.Sub(t0); got < d-slack {
		h.t.Errorf("%s: granted %v after the update; want at least %v", what, got, d)
	}
}

// waitError asserts that err is a *store.WaitError wrapping want.
func (h *harness) waitError(err, want error, what string) *store.WaitError {
	h.t.Helper()
	if !errors.Is(err, want) {
		h.t.Errorf("%s: Acquire = %v; want an error wrapping %v", what, err, want)
	}
	var we *store.WaitError
	if !errors.As(err, &we) {
		h.t.Errorf("%s: Acquire = %T (%v); want a *store.WaitError", what, err, err)
		return &store.WaitError{}
	}
	return we
}

// testUnknownRoute: a route never seen goes at once, one request at a time
// per (route, major), and the first response teaches the bucket to the
// request queued behind it.
func testUnknownRoute(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	p1 := h.acquireNow(c)

	second := h.acquireAsync(h.t.Context(), c)
	second = h.stillWaiting(second, watch, "second request on an unknown route")

	// Other majors and other routes probe on their own.
	other := claim(c.Credential, routeCreate, major2)
	h.update(h.acquireNow(other), limits(other, "h", 5, 4, far))
	otherRoute := claim(c.Credential, routeEdit, major1)
	h.update(h.acquireNow(otherRoute), limits(otherRoute, "e", 5, 4, far))

	h.update(p1, limits(c, "h", 5, 4, far))
	r := h.granted(second, "request queued behind the first response")
	if r.p.Bucket != "h" {
		h.t.Errorf("queued request: Permit.Bucket = %q; want %q", r.p.Bucket, "h")
	}
	// The first response left 4; the queued request took one.
	for i := range 3 {
		p := h.acquireNow(c)
		if p.Bucket != "h" {
			h.t.Errorf("request %d on the learned bucket: Permit.Bucket = %q; want %q", i, p.Bucket, "h")
		}
	}
	h.mustWait(c, watch)
}

// testQueuedFollowLearnedBucket: requests queued behind the first response
// follow the learned bucket, its remaining count and its reset.
func testQueuedFollowLearnedBucket(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	p1 := h.acquireNow(c)
	a := h.queue(h.t.Context(), c)
	b := h.queue(h.t.Context(), c)

	const reset = 300 * time.Millisecond
	t0 := time.Now()
	h.update(p1, limits(c, "h", 2, 0, reset))
	for i, ch := range []<-chan result{a, b} {
		what := fmt.Sprintf("queued request %d", i)
		r := h.granted(ch, what)
		h.notBefore(r, t0, reset, what)
		if r.p.Bucket != "h" {
			h.t.Errorf("%s: Permit.Bucket = %q; want %q", what, r.p.Bucket, "h")
		}
	}
}

// testProbePerMajor: when a response on one major teaches the route's bucket
// while the first request on another major is still unanswered, that major's
// counter is still unknown: its next request waits for the first answer.
func testProbePerMajor(h *harness) {
	c1 := claim(h.cred("a"), routeCreate, major1)
	c2 := claim(c1.Credential, routeCreate, major2)
	p1 := h.acquireNow(c1)
	p2 := h.acquireNow(c2)
	h.update(p1, limits(c1, "h", 5, 4, far))

	second := h.acquireAsync(h.t.Context(), c2)
	second = h.stillWaiting(second, watch, "second request on a major whose first is unanswered")
	h.update(p2, limits(c2, "h", 5, 4, far))
	r := h.granted(second, "second request once the first is answered")
	if r.p.Bucket != "h" {
		h.t.Errorf("Permit.Bucket = %q; want %q", r.p.Bucket, "h")
	}
}

// testRemainingCountsGrants: with remaining k, exactly k requests go at once.
// At the reset a response dated, the next window opens less a slot for each
// request still in flight, which may arrive at Discord in it; a response
// dated the window that ended gives its request's slot back, and one
// without headers does not.
func testRemainingCountsGrants(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	const reset = 400 * time.Millisecond
	t0 := time.Now()
	end := t0.Add(reset) // the window's end, on Discord's clock too
	dated := func(remaining int) store.Update {
		u := limits(c, "h", 4, remaining, max(0, time.Until(end)))
		u.Reset = end
		return u
	}
	// The first two responses count their requests: 2 of 4 left.
	h.update(h.acquireNow(c), dated(3))
	h.update(h.acquireNow(c), dated(2))
	p3 := h.acquireNow(c)
	p4 := h.acquireNow(c)

	ctx := h.t.Context()
	first := h.stillWaiting(h.acquireAsync(ctx, c), reset/2, "request while the window is spent")
	r := h.granted(first, "request of the next window")
	h.notBefore(r, t0, reset, "request of the next window")
	// Of the next window's 4 slots, 2 are kept for p3 and p4.
	second := h.acquireAsync(ctx, c)
	h.granted(second, "second request of the next window")
	third := h.stillWaiting(h.acquireAsync(ctx, c), watch, "request while two of the last window's requests are in flight")

	h.update(p3, dated(1)) // it arrived in the window that ended
	h.granted(third, "request after a response of the ended window gave its slot back")

	h.update(p4, response(c, 500)) // an answer without rate-limit headers: it may have counted in the new window
	h.stillWaiting(h.acquireAsync(ctx, c), watch, "request while the new window is spent")
}

// testSharedHashPerMajor: routes that share a hash share a counter per major;
// majors and credentials have their own counters.
func testSharedHashPerMajor(h *harness) {
	cred := h.cred("a")
	create1 := claim(cred, routeCreate, major1)
	list1 := claim(cred, routeList, major1)
	create2 := claim(cred, routeCreate, major2)
	list2 := claim(cred, routeList, major2)

	h.learn(create1, "h", 3, 2, far)
	h.learn(list2, "h", 3, 2, far)

	// Major 1: two left, shared by both routes.
	h.acquireNow(create1)
	h.acquireNow(list1)
	h.mustWait(create1, watch)
	h.mustWait(list1, watch)

	// Major 2: its own two.
	h.acquireNow(create2)
	h.acquireNow(list2)
	h.mustWait(list2, watch)

	// Another credential: its own state entirely.
	other := claim(h.cred("b"), routeCreate, major1)
	h.learn(other, "h", 3, 2, far)
	h.acquireNow(other)
	h.acquireNow(other)
}

// testProbeKeepsSlot: the first request of a route whose bucket is not
// known (its probe) may count in a known bucket of its major, since routes
// share hashes; while it is in flight, the known buckets of the major keep
// a slot for it. When its answer names another bucket, the slot goes at
// once; when it names the same one, the bucket follows its count; when it
// never comes, the slot goes once the probe is overdue (the hold after its
// grant and a quarter of a second: the long hold keeps a slow machine's
// pauses from making a probe overdue in the checks before).
func testProbeKeepsSlot(h *harness) {
	cred := h.cred("a")
	ctx := h.t.Context()

	// Major 1: the probe's route turns out to have a bucket of its own.
	create := claim(cred, routeCreate, major1)
	h.learn(create, "h", 3, 2, far)
	h.acquireNow(create) // one slot left
	probe := h.acquireNow(claim(cred, routeList, major1))
	last := h.stillWaiting(h.acquireAsync(ctx, create), watch, "last slot of a bucket while a probe of its major is in flight")
	h.update(probe, limits(probe.Claim, "other", 5, 4, far))
	h.granted(last, "last slot once the probe's answer names another bucket")

	// Major 2: the probe's route shares the bucket, whose last slot it took.
	create2 := claim(cred, routeCreate, major2)
	h.learn(create2, "h", 3, 2, far)
	h.acquireNow(create2)
	probe2 := h.acquireNow(claim(cred, routeEdit, major2))
	after := h.stillWaiting(h.acquireAsync(ctx, create2), watch, "last slot of a bucket while a probe of its major is in flight")
	h.update(probe2, limits(probe2.Claim, "h", 3, 0, far))
	h.stillWaiting(after, watch, "request after the probe's answer spent the bucket it shares")

	// Major 3: the probe is never answered (its process stopped): the slot
	// goes once the probe is overdue.
	create3 := claim(cred, routeCreate, major3)
	h.learn(create3, "h", 3, 2, far)
	h.acquireNow(create3)
	h.acquireNow(claim(cred, routeChan, major3))
	overdue := h.stillWaiting(h.acquireAsync(ctx, create3), watch, "last slot while an unanswered probe may still count")
	h.granted(overdue, "last slot once the unanswered probe is overdue")
}

// testNoBucketRoute: a route answering 2xx without rate-limit headers is
// bound by the global limit only.
func testNoBucketRoute(h *harness) {
	c := claim(h.cred("a"), routeMe, "")
	c.Global = true
	c.GlobalLimit = 1000
	p := h.acquireNow(c)
	queued := []<-chan result{h.queue(h.t.Context(), c), h.queue(h.t.Context(), c)}
	h.update(p, response(c, 200))
	for i, ch := range queued {
		r := h.granted(ch, fmt.Sprintf("request %d queued behind the first response", i))
		h.update(r.p, response(c, 200))
	}

	const n = 20
	ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
	defer cancel()
	var chans []<-chan result
	for range n {
		chans = append(chans, h.acquireAsync(ctx, c))
	}
	var permits []*store.Reservation
	for i, ch := range chans {
		r := h.await(ch, "concurrent request")
		if r.err != nil {
			h.t.Errorf("concurrent request %d on a route without bucket: Acquire = %v; want a permit at once", i, r.err)
			continue
		}
		if r.p.Bucket != "" {
			h.t.Errorf("request on a route without bucket: Permit.Bucket = %q; want \"\"", r.p.Bucket)
		}
		permits = append(permits, r.p)
	}
	for _, p := range permits {
		h.update(p, response(c, 200))
	}
}

// testStaleRemaining: within a window, a response reporting more remaining
// than the store knows never raises it.
func testStaleRemaining(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 5, 4, far)
	p1 := h.acquireNow(c)
	p2 := h.acquireNow(c)
	h.acquireNow(c)
	// Responses reordered or from before the other grants.
	h.update(p2, limits(c, "h", 5, 3, far))
	h.update(p1, limits(c, "h", 5, 4, far))
	h.acquireNow(c)
	h.mustWait(c, watch)
}

// testResetOnlyMovesLater: a response naming an earlier reset does not reopen
// the window early.
func testResetOnlyMovesLater(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	const reset = 300 * time.Millisecond
	t0 := time.Now()
	h.learn(c, "h", 2, 1, reset)
	p := h.acquireNow(c)
	h.update(p, limits(c, "h", 2, 0, 10*time.Millisecond))
	r := h.granted(h.acquireAsync(h.t.Context(), c), "request after the reset")
	h.notBefore(r, t0, reset, "request after an earlier reset was reported")
}

// testUnknownResetAfter: a negative ResetAfter means unknown and is taken as
// at least one second.
func testUnknownResetAfter(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	t0 := time.Now()
	h.learn(c, "h", 1, 0, -1)
	h.mustWait(c, watch)
	r := h.granted(h.acquireAsync(h.t.Context(), c), "request after an unknown reset")
	h.notBefore(r, t0, time.Second, "request after an unknown reset")
}

// testLimitRaised: a limit raised within the window gives the new slots.
func testLimitRaised(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, far)
	p := h.acquireNow(c)
	h.mustWait(c, watch)
	// Discord raised the limit to 4: 2 used, 2 left.
	h.update(p, limits(c, "h", 4, 2, far))
	h.acquireNow(c)
	h.acquireNow(c)
	h.mustWait(c, watch)
}

// testLimitLowered: a limit lowered within the window takes slots away.
func testLimitLowered(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 5, 4, far)
	p := h.acquireNow(c)
	// Discord lowered the limit to 3: 2 used, 1 left.
	h.update(p, limits(c, "h", 3, 1, far))
	h.acquireNow(c)
	h.mustWait(c, watch)
}

// testSpentRecallsGrants: a 429 that spends a bucket takes back the grants
// of it that have not left (the caller checks Lapsed just before sending):
// sent, they would meet the same 429. An ordinary response takes nothing
// back.
func testSpentRecallsGrants(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 5, 4, far)
	p1, p2, p3 := h.acquireNow(c), h.acquireNow(c), h.acquireNow(c)
	h.update(p1, limits(c, "h", 5, 3, far))
	if p2.Lapsed() || p3.Lapsed() {
		h.t.Fatalf("a grant lapsed after a response that left room: Lapsed() = %v, %v; want false", p2.Lapsed(), p3.Lapsed())
	}
	u := limits(c, "h", 5, 0, 300*time.Millisecond)
	u.Status, u.Scope, u.RetryAfter = 429, store.ScopeUser, 300*time.Millisecond
	h.update(p2, u)
	if !p3.Lapsed() {
		h.t.Fatal("a grant made before a 429 that paused its bucket: Lapsed() = false; want true, at once")
	}
	p3.Cancel()
	h.mustWait(c, watch)
}

// testLoweredRecallsGrants: a response that lowers a bucket's limit below
// what it granted takes back the grants that have not left, in every
// process of a shared store, and the claims that follow wait.
func testLoweredRecallsGrants(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 5, 4, far)
	p1, p2, p3 := h.acquireNow(c), h.acquireNow(c), h.acquireNow(c)
	// Discord lowered the limit to 2, spent by the learning request and p1.
	h.update(p1, limits(c, "h", 2, 0, far))
	// Taken back, not lapsed of age: before SendBy (half the global hold,
	// a second here, so that a busy host's delay in applying the report
	// cannot pass it), which a shared store's note beats by far.
	for {
		lapsed := p2.Lapsed() && p3.Lapsed()
		if !time.Now().Before(p2.SendBy) {
			h.t.Fatal("grants made before the limit was lowered below them did not lapse before their SendBy")
		}
		if lapsed {
			break
		}
		time.Sleep(time.Millisecond)
	}
	p2.Cancel()
	p3.Cancel()
	h.mustWait(c, watch)
}

// testFIFO: waiters on one exhausted bucket are granted in arrival order.
func testFIFO(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	const (
		n       = 5
		reset   = 800 * time.Millisecond
		step    = 30 * time.Millisecond
		stagger = 60 * time.Millisecond // n*stagger < reset
	)
	t0 := time.Now()
	h.learn(c, "h", 1, 0, reset)

	var (
		mu    sync.Mutex
		order []int
		wg    sync.WaitGroup
		errs  = make(chan error, n)
	)
	ctx, cancel := context.WithTimeout(h.t.Context(), eventually)
	defer cancel()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := h.s.Acquire(ctx, c)
			if err != nil {
				errs <- fmt.Errorf("waiter %d: Acquire = %w", i, err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			if err := p.Report(ctx, limits(c, "h", 1, 0, step)); err != nil {
				errs <- fmt.Errorf("waiter %d: Report = %w", i, err)
			}
		}()
		// Let waiter i join the queue before waiter i+1 arrives.
		time.Sleep(stagger)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		h.t.Error(err)
	}
	if want := []int{0, 1, 2, 3, 4}; !slices.Equal(order, want) {
		h.t.Errorf("grant order = %v; want %v", order, want)
	}
	if elapsed := time.Since(t0); elapsed < reset+(n-1)*step-slack {
		h.t.Errorf("%d waiters on a bucket of 1 were served within %v; want at least %v", n, elapsed, reset+(n-1)*step)
	}
}

// testPriority: urgent waiters go ahead of normal ones, by arrival within
// their lane, and at most four urgent grants come in a row while normal
// ones wait.
func testPriority(h *harness) {
	const step = 60 * time.Millisecond
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 1, 0, 300*time.Millisecond)
	urgent := c
	urgent.Priority = store.PriorityUrgent

	ctx, cancel := context.WithTimeout(h.t.Context(), eventually)
	defer cancel()
	type arrival struct {
		name string
		ch   <-chan result
	}
	var line []arrival
	for _, a := range []struct {
		name string
		c    store.Claim
	}{
		{"n1", c}, {"n2", c}, {"u1", urgent}, {"u2", urgent}, {"u3", urgent}, {"u4", urgent}, {"u5", urgent},
	} {
		line = append(line, arrival{a.name, h.queue(ctx, a.c)})
	}
	// One slot per window: each grant answers with the next window.
	var order []string
	pending := line
	for len(pending) > 0 {
		var next []arrival
		got := ""
		for _, a := range pending {
			select {
			case r := <-a.ch:
				if r.err != nil {
					h.t.Fatalf("%s: Acquire = %v", a.name, r.err)
				}
				if got != "" {
					h.t.Fatalf("%s and %s granted in one window of one slot", got, a.name)
				}
				got = a.name
				h.update(r.p, limits(c, "h", 1, 0, step))
			default:
				next = append(next, a)
			}
		}
		if got == "" {
			time.Sleep(5 * time.Millisecond)
			if ctx.Err() != nil {
				h.t.Fatalf("grant order so far %v; the rest still wait", order)
			}
			continue
		}
		order = append(order, got)
		pending = next
	}
	// Four urgent grants in a row at most while normal ones wait: n1 goes
	// after u4, and u5 before n2.
	if want := []string{"u1", "u2", "u3", "u4", "n1", "u5", "n2"}; !slices.Equal(order, want) {
		h.t.Errorf("grant order = %v; want %v", order, want)
	}
}

// testCancelWaiter: a cancelled waiter returns context.Canceled and leaves
// the queue; the next waiter gets the slot.
func testCancelWaiter(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	const reset = 400 * time.Millisecond
	t0 := time.Now()
	h.learn(c, "h", 1, 0, reset)

	ctx, cancel := context.WithCancel(h.t.Context())
	defer cancel()
	a := h.queue(ctx, c)
	b := h.queue(h.t.Context(), c)
	cancel()
	r := h.await(a, "cancelled waiter")
	if r.err == nil {
		h.t.Fatalf("cancelled waiter got a permit; want context.Canceled")
	}
	h.waitError(r.err, context.Canceled, "cancelled waiter")

	r = h.granted(b, "waiter behind a cancelled one")
	h.notBefore(r, t0, reset, "waiter behind a cancelled one")
}

// testCancelGivesBackSlot: a waiter cancelled while it holds its bucket slot
// (waiting for the global window) gives the slot back.
func testCancelGivesBackSlot(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, far) // not global: the global window stays empty

	g := c
	g.Global = true
	g.GlobalLimit = 1
	other := claim(c.Credential, routeList, major2)
	other.Global = true
	other.GlobalLimit = 1
	h.acquireNow(other) // fills the global window

	ctx, cancel := context.WithCancel(h.t.Context())
	defer cancel()
	a := h.queue(ctx, g)
	time.Sleep(50 * time.Millisecond)
	cancel()
	r := h.await(a, "cancelled global waiter")
	if r.err == nil {
		h.t.Fatalf("global waiter got a permit with the global window full")
	}
	h.waitError(r.err, context.Canceled, "cancelled global waiter")

	// The bucket's last slot is free again for a request outside the
	// global limit.
	h.acquireNow(c)
}

// testDeadlineBeforeKnownWait: a deadline before a known reset fails at once.
func testDeadlineBeforeKnownWait(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 1, 0, 5*time.Second)

	ctx, cancel := context.WithTimeout(h.t.Context(), time.Second)
	defer cancel()
	_, err := h.s.Acquire(ctx, c)
	if err == nil {
		h.t.Fatalf("Acquire on an exhausted bucket granted a permit")
	}
	if ctx.Err() != nil {
		h.t.Errorf("Acquire returned only when the deadline passed; want it to fail at once when the known wait ends after the deadline")
	}
	we := h.waitError(err, context.DeadlineExceeded, "deadline before the reset")
	if we.RetryAfter <= 0 {
		h.t.Errorf("WaitError.RetryAfter = %v; want > 0", we.RetryAfter)
	}

	// Pauses are known waits too.
	g := claim(c.Credential, routeList, major2)
	g.Global = true
	p := h.acquireNow(g)
	h.update(p, tooMany(g, store.ScopeGlobal, 5*time.Second))
	ctx, cancel = context.WithTimeout(h.t.Context(), time.Second)
	defer cancel()
	_, err = h.s.Acquire(ctx, g)
	if err == nil {
		h.t.Fatalf("Acquire during a global pause granted a permit")
	}
	if ctx.Err() != nil {
		h.t.Errorf("Acquire during a global pause returned only when the deadline passed; want it to fail at once")
	}
	we = h.waitError(err, context.DeadlineExceeded, "deadline before the end of a global pause")
	if we.RetryAfter <= 0 {
		h.t.Errorf("WaitError.RetryAfter = %v; want > 0", we.RetryAfter)
	}
}

// testDeadlineBehindGrant: waiters queued for a bucket's reset, when the
// reset's one slot goes to the first of them, fail at once if their
// deadlines come before the window after it, not when those deadlines
// pass.
func testDeadlineBehindGrant(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	const window = 300 * time.Millisecond
	h.learn(c, "h", 1, 0, window) // one per 300 ms, spent until t0+300ms
	t0 := time.Now()
	const waiters, deadline = 4, 2 * window
	ctx, cancel := context.WithTimeout(h.t.Context(), deadline)
	defer cancel()
	var chs []<-chan result
	for range waiters {
		chs = append(chs, h.queue(ctx, c))
	}
	granted := 0
	for i, ch := range chs {
		what := fmt.Sprintf("waiter %d of %d, deadline %v after the update", i+1, waiters, deadline)
		r := h.await(ch, what)
		if r.err == nil {
			granted++
			h.notBefore(r, t0, window, what)
			continue
		}
		if ctx.Err() != nil {
			h.t.Errorf("%s: failed only when its deadline passed (%v after the update); want it to fail when the reset's slot went to the first waiter", what, r.at.Sub(t0))
		}
		we := h.waitError(r.err, context.DeadlineExceeded, what)
		if we.RetryAfter <= 0 {
			h.t.Errorf("%s: WaitError.RetryAfter = %v; want > 0", what, we.RetryAfter)
		}
	}
	if granted != 1 {
		h.t.Errorf("%d waiters granted in the window after the reset; want 1", granted)
	}
}

// testMaxWaitBeforeKnownWait: a MaxWait shorter than a known reset fails at
// once with ErrWaitTooLong.
func testMaxWaitBeforeKnownWait(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 1, 0, 5*time.Second)
	c.MaxWait = time.Second
	start := time.Now()
	_, err := h.s.Acquire(h.t.Context(), c)
	if err == nil {
		h.t.Fatalf("Acquire on an exhausted bucket granted a permit")
	}
	if elapsed := time.Since(start); elapsed >= c.MaxWait {
		h.t.Errorf("Acquire failed after %v; want it to fail at once, before MaxWait %v", elapsed, c.MaxWait)
	}
	we := h.waitError(err, store.ErrWaitTooLong, "MaxWait before the reset")
	if we.RetryAfter <= 0 {
		h.t.Errorf("WaitError.RetryAfter = %v; want > 0", we.RetryAfter)
	}
}

// testDeadlineDuringUnknownWait: a wait of unknown length ends with the
// deadline or MaxWait.
func testDeadlineDuringUnknownWait(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.acquireNow(c) // the response never comes: the wait is unknown

	const d = 200 * time.Millisecond
	ctx, cancel := context.WithTimeout(h.t.Context(), d)
	defer cancel()
	start := time.Now()
	_, err := h.s.Acquire(ctx, c)
	elapsed := time.Since(start)
	if err == nil {
		h.t.Fatalf("second request on an unknown route granted while the first is unreported")
	}
	h.waitError(err, context.DeadlineExceeded, "deadline during an unknown wait")
	if elapsed < d-slack {
		h.t.Errorf("Acquire gave up after %v; want it to wait until the deadline (%v)", elapsed, d)
	}

	c.MaxWait = d
	start = time.Now()
	_, err = h.s.Acquire(h.t.Context(), c)
	elapsed = time.Since(start)
	if err == nil {
		h.t.Fatalf("second request on an unknown route granted while the first is unreported")
	}
	h.waitError(err, store.ErrWaitTooLong, "MaxWait during an unknown wait")
	if elapsed < d-slack {
		h.t.Errorf("Acquire gave up after %v; want it to wait MaxWait (%v)", elapsed, d)
	}
}

// globalClaim learns a route with room for many requests, without counting
// against the global window, and returns a global claim on it, of a
// credential whose global limit is limit.
func (h *harness) globalClaim(cred string, limit int) store.Claim {
	h.t.Helper()
	c := claim(cred, routeCreate, major1)
	h.learn(c, "h", 10000, 9999, far) // not global: not counted
	c.Global = true
	c.GlobalLimit = limit
	return c
}

// testGlobalBurst: a burst of GlobalLimit goes at once; the next request of
// the credential waits; requests outside the global limit and other
// credentials are not affected.
func testGlobalBurst(h *harness) {
	const n = 5
	g := h.globalClaim(h.cred("a"), n)
	local := g
	local.Global = false
	for range 2 * n {
		h.acquireNow(local) // not counted
	}
	for range n {
		h.acquireNow(g)
	}
	h.mustWait(g, watch)
	// Another route of the same credential counts against the same window.
	g2 := claim(g.Credential, routeList, major2)
	g2.Global, g2.GlobalLimit = true, n
	h.mustWait(g2, watch)
	// Not limited either.
	h.acquireNow(local)

	other := h.globalClaim(h.cred("b"), n)
	for range n {
		h.acquireNow(other)
	}
	h.mustWait(other, watch)
}

// testGlobalSlidingWindow: concurrent requests never exceed GlobalLimit
// within any GlobalWindow.
func testGlobalSlidingWindow(h *harness) {
	const (
		n      = 4
		window = slidingWindow
		total  = 16
		// tolerance covers the delay between a grant and the moment its
		// goroutine reads the clock.
		tolerance = window / 2
	)
	g := h.globalClaim(h.cred("a"), n)
	ctx, cancel := context.WithTimeout(h.t.Context(), eventually)
	defer cancel()
	var chans []<-chan result
	for range total {
		chans = append(chans, h.acquireAsync(ctx, g))
	}
	var times []time.Time
	for i, ch := range chans {
		r := h.await(ch, "global request")
		if r.err != nil {
			h.t.Errorf("global request %d: Acquire = %v; want a permit", i, r.err)
			continue
		}
		times = append(times, r.at)
		h.update(r.p, limits(g, "h", 10000, 9000, far))
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	for i := 0; i+n < len(times); i++ {
		if d := times[i+n].Sub(times[i]); d < window-tolerance {
			h.t.Errorf("grants %d and %d of a credential came %v apart; want at least the global window %v (less %v tolerance) between a grant and the %dth after it",
				i, i+n, d, window, tolerance, n)
		}
	}
}

// testGlobal429: a global 429 pauses the credential's global requests for
// RetryAfter + ResetOffset, and nothing else.
func testGlobal429(h *harness) {
	g := h.globalClaim(h.cred("a"), 1000)
	p := h.acquireNow(g)

	const retry, offset = 250 * time.Millisecond, 50 * time.Millisecond
	u := tooMany(g, store.ScopeGlobal, retry)
	t0 := time.Now()
	h.update(p, u)

	same := h.acquireAsync(h.t.Context(), g)
	unknown := claim(g.Credential, routeEdit, major3)
	unknown.Global, unknown.GlobalLimit = true, g.GlobalLimit
	other := h.acquireAsync(h.t.Context(), unknown)

	local := g
	local.Global = false
	h.acquireNow(local)
	h.acquireNow(h.globalClaim(h.cred("b"), 1000))

	r := h.granted(same, "global request after a global 429")
	h.notBefore(r, t0, retry+offset, "global request after a global 429")
	r = h.granted(other, "global request on another route after a global 429")
	h.notBefore(r, t0, retry+offset, "global request on another route after a global 429")
}

// testUser429: a user 429 blocks its bucket for RetryAfter + ResetOffset.
func testUser429(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 10, 9, 200*time.Millisecond)
	c2 := claim(c.Credential, routeCreate, major2)
	h.learn(c2, "h", 10, 9, far)
	p := h.acquireNow(c)

	const retry, offset = 300 * time.Millisecond, 50 * time.Millisecond
	u := limits(c, "h", 10, 0, retry)
	u.Status = 429
	u.Scope = store.ScopeUser
	u.RetryAfter = retry
	t0 := time.Now()
	h.update(p, u)

	waiting := h.acquireAsync(h.t.Context(), c)
	h.acquireNow(c2) // another major is not affected
	r := h.granted(waiting, "request after a user 429")
	h.notBefore(r, t0, retry+offset, "request after a user 429")
}

// testRetryKeepsPlace: a request claimed again after its 429 (Claim.Retry)
// goes ahead of the requests that queued behind the pause, rather than
// behind them.
func testRetryKeepsPlace(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 1, 1, 200*time.Millisecond)
	p := h.acquireNow(c)
	u := limits(c, "h", 1, 0, 200*time.Millisecond)
	u.Status = 429
	u.Scope = store.ScopeUser
	u.RetryAfter = 200 * time.Millisecond
	h.update(p, u)

	ctx := h.t.Context()
	later1 := h.queue(ctx, c)
	later2 := h.queue(ctx, c)
	retry := c
	retry.Retry = true
	r := h.granted(h.acquireAsync(ctx, retry), "the retry")
	later1 = h.stillWaiting(later1, watch, "a request that queued during the pause, while the retry is in flight")
	later2 = h.stillWaiting(later2, 0, "another request that queued during the pause")
	h.update(r.p, limits(c, "h", 1, 0, 50*time.Millisecond))
	h.update(h.granted(later1, "the first request queued during the pause").p, limits(c, "h", 1, 0, 50*time.Millisecond))
	h.update(h.granted(later2, "the second request queued during the pause").p, limits(c, "h", 1, 0, 50*time.Millisecond))
}

// testLearnedLimit: a 429 of scope user while the headers said requests
// remained shows the bucket's real limit: each window then grants what
// passed in the window that showed it (here one), whatever the headers
// claim, until a response names another limit.
func testLearnedLimit(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 10, 9, 200*time.Millisecond) // one passed
	p := h.acquireNow(c)                         // the headers said 9 remained

	const retry, offset = 250 * time.Millisecond, 20 * time.Millisecond
	u := limits(c, "h", 10, 8, 150*time.Millisecond)
	u.Status = 429
	u.Scope = store.ScopeUser
	u.RetryAfter = retry
	t0 := time.Now()
	h.update(p, u)

	r := h.granted(h.acquireAsync(h.t.Context(), c), "request after the 429")
	h.notBefore(r, t0, retry+offset, "request after the 429")
	// One per window: the next waits for the window's reset, though the
	// headers claim nine more.
	next := h.stillWaiting(h.acquireAsync(h.t.Context(), c), watch, "second request in the capped window")
	t1 := time.Now()
	h.update(r.p, limits(c, "h", 10, 9, 200*time.Millisecond))
	r = h.granted(next, "second request in the next window")
	h.notBefore(r, t1, 200*time.Millisecond, "second request in the next window")

	// A response naming another limit ends the cap.
	h.update(r.p, limits(c, "h", 20, 19, 200*time.Millisecond))
	h.acquireNow(c)
	h.acquireNow(c)
}

// testSpacing: a claim's Spacing holds its bucket to one request in flight,
// Spacing apart counted from the last response.
func testSpacing(h *harness) {
	const spacing = 200 * time.Millisecond
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 10, 9, far)
	c.Spacing = spacing
	p := h.acquireNow(c)
	next := h.stillWaiting(h.acquireAsync(h.t.Context(), c), watch, "second request while the first is in flight")
	t0 := time.Now()
	// A response naming another limit ends a learned hold, not the
	// spacing claims ask for.
	h.update(p, limits(c, "h", 20, 18, far))
	r := h.granted(next, "second request after the spacing")
	h.notBefore(r, t0, spacing, "second request after the spacing")
	// Claims without the spacing are held while the bucket is.
	plain := claim(c.Credential, routeCreate, major1)
	h.mustWait(plain, watch)
}

// testHiddenSublimit: a user 429 of a claim with a Kind whose retry_after
// outlasts its bucket's reset holds only the claims of that kind on that
// route and major; the bucket's other requests go on under its headers.
func testHiddenSublimit(h *harness) {
	edit := claim(h.cred("a"), routeChan, major1)
	h.learn(edit, "e", 5, 4, 100*time.Millisecond)
	rename := edit
	rename.Kind = "rename"
	p := h.acquireNow(rename)

	const retry = 2500 * time.Millisecond // longer than atOnce: a paused bucket would fail acquireNow
	u := limits(rename, "e", 5, 3, 100*time.Millisecond)
	u.Status = 429
	u.Scope = store.ScopeUser
	u.RetryAfter = retry
	t0 := time.Now()
	h.update(p, u)

	h.update(h.acquireNow(edit), limits(edit, "e", 5, 3, 100*time.Millisecond)) // not a rename: goes on
	other := rename
	other.Major = major2
	h.update(h.acquireNow(other), limits(other, "e", 5, 4, 100*time.Millisecond)) // another channel's renames go on

	now := rename
	now.NoWait = true
	_, err := h.s.Acquire(h.t.Context(), now)
	if we := h.waitError(err, store.ErrWaitTooLong, "a rename under the sublimit, NoWait"); we.RetryAfter < retry-watch-slack {
		h.t.Errorf("a rename under the sublimit: RetryAfter = %v; want about %v", we.RetryAfter, retry)
	}
	if est, ok := h.s.(store.Estimator); ok {
		if d, err := est.Estimate(h.t.Context(), rename); err != nil || d < retry-watch-slack {
			h.t.Errorf("Estimate(a rename under the sublimit) = %v, %v; want about %v", d, err, retry)
		}
		if d, err := est.Estimate(h.t.Context(), edit); err != nil || d > 0 {
			h.t.Errorf("Estimate(another edit) = %v, %v; want 0", d, err)
		}
	}
	// The renames that waited go one at a time: the sublimit may let
	// fewer through than the bucket.
	first := h.acquireAsync(h.t.Context(), rename)
	time.Sleep(30 * time.Millisecond)
	second := h.acquireAsync(h.t.Context(), rename)
	r := h.granted(first, "a rename after the sublimit")
	h.notBefore(r, t0, retry, "a rename after the sublimit")
	h.acquireNow(edit) // the waiting renames held no slot of the bucket meanwhile
	second = h.stillWaiting(second, watch, "a second rename while the first is out")
	h.update(r.p, limits(rename, "e", 5, 3, 100*time.Millisecond))
	h.granted(second, "a second rename after the first's response")
}

// testKindOneAtATime: the claims of a Kind go one at a time from the
// first, before any 429, in arrival order: the next is granted once the
// one before is reported, answered or unsent. Claims without the Kind, and
// claims of the Kind on another major, are not held.
func testKindOneAtATime(h *harness) {
	edit := claim(h.cred("a"), routeChan, major1)
	h.learn(edit, "e", 50, 49, far)
	rename := edit
	rename.Kind = "rename"
	ctx := h.t.Context()

	first := h.acquireNow(rename)
	second := h.queue(ctx, rename)
	third := h.queue(ctx, rename)
	h.update(h.acquireNow(edit), limits(edit, "e", 50, 47, far)) // not a rename: goes on
	other := rename
	other.Major = major2
	h.update(h.acquireNow(other), limits(other, "e", 50, 49, far)) // another channel's renames go on
	second = h.stillWaiting(second, watch, "a rename while another of the channel is out")

	h.update(first, limits(rename, "e", 50, 46, far))
	r := h.granted(second, "the second rename, after the first's response")
	third = h.stillWaiting(third, watch, "the third rename while the second is out")
	h.update(r.p, unsent(rename))
	r = h.granted(third, "the third rename, after the second was given back unsent")
	h.update(r.p, limits(rename, "e", 50, 45, far))
	h.update(h.acquireNow(rename), limits(rename, "e", 50, 44, far)) // nothing out: at once
}

// testShared429: a shared 429 delays its bucket by RetryAfter and leaves its
// counter alone.
func testShared429(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 5, 4, far)
	c2 := claim(c.Credential, routeCreate, major2)
	h.learn(c2, "h", 5, 4, far)
	p := h.acquireNow(c) // 3 left

	const retry = 300 * time.Millisecond
	u := limits(c, "h", 5, 3, far)
	u.Status = 429
	u.Scope = store.ScopeShared
	u.RetryAfter = retry
	t0 := time.Now()
	h.update(p, u)

	waiting := h.acquireAsync(h.t.Context(), c)
	h.acquireNow(c2) // another major is not affected
	r := h.granted(waiting, "request after a shared 429")
	h.notBefore(r, t0, retry, "request after a shared 429")
	// The shared 429 did not touch the counter: 2 of the 3 are left.
	h.acquireNow(c)
	h.acquireNow(c)
	h.mustWait(c, watch)
}

// testShared429Uncounted: a shared 429 whose headers show that the bucket
// did not count its request (Remaining as before it) gives its slot back:
// the busy resource waits, and the bucket's other requests have its whole
// count. Headers that did count it would have said so, and a count is
// never raised by headers.
func testShared429Uncounted(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 5, 4, far)
	busy := c
	busy.Path = "/channels/1/messages/2/reactions/x/@me"
	p := h.acquireNow(busy) // 3 left, as far as the store knows
	u := limits(busy, "h", 5, 4, far)
	u.Status, u.Scope, u.RetryAfter = 429, store.ScopeShared, far
	h.update(p, u)
	for range 4 {
		h.acquireNow(c)
	}
	h.mustWait(c, watch)
}

// testBlocked429: a header-less 429 (a Cloudflare block, per IP address)
// holds every request of its route from every credential for the block
// pause, then lets one probe through at a time; a probe blocked again
// waits the same pause, one blocked after it twice that (the probes go
// when the block has lasted one, two, four... pauses); a probe that
// passes releases everyone. Other routes go on.
func testBlocked429(h *harness) {
	h = h.with(store.Policy{BlockPause: time.Second, BlockPauseMax: 2 * time.Second})
	a, b := h.cred("a"), h.cred("b")
	bucketed := claim(a, routeCreate, major1)
	h.learn(bucketed, "h", 100, 99, far)
	p := h.acquireNow(bucketed)
	t0 := time.Now()
	h.update(p, tooMany(bucketed, store.ScopeBlocked, 0))

	// Every credential's requests of the route wait, and say why.
	for _, c := range []store.Claim{bucketed, claim(b, routeCreate, major2)} {
		c.NoWait = true
		_, err := h.s.Acquire(h.t.Context(), c)
		we := h.waitError(err, store.ErrWaitTooLong, describe(c)+" during a block")
		if we.Scope != store.ScopeBlocked || we.RetryAfter < 500*time.Millisecond {
			h.t.Errorf("%s during a block: WaitError scope %q, retry after %v; want %q and about a second", describe(c), we.Scope, we.RetryAfter, store.ScopeBlocked)
		}
	}
	// Another route is not blocked.
	h.acquireNow(claim(a, routeMe, ""))

	first := h.queue(h.t.Context(), bucketed)
	second := h.queue(h.t.Context(), claim(b, routeCreate, major2))
	third := h.queue(h.t.Context(), claim(b, routeCreate, major3))
	fourth := h.queue(h.t.Context(), claim(a, routeCreate, major1))
	probe := h.granted(first, "first request after the block")
	h.notBefore(probe, t0, time.Second, "the probe")
	// One probe at a time.
	second = h.stillWaiting(second, watch, "a second request while the probe is out")
	t1 := time.Now()
	h.update(probe.p, tooMany(bucketed, store.ScopeBlocked, 0))
	// Blocked again: the block has lasted a pause; the next probe goes
	// when it has lasted two.
	next := h.granted(second, "the next probe")
	h.notBefore(next, t1, time.Second, "the next probe")
	third = h.stillWaiting(third, watch, "a third request while the next probe is out")
	t2 := time.Now()
	h.update(next.p, tooMany(claim(b, routeCreate, major2), store.ScopeBlocked, 0))
	// Blocked a third time: the pause doubles.
	last := h.granted(third, "the probe after two blocked")
	h.notBefore(last, t2, 2*time.Second, "the probe after two blocked")
	fourth = h.stillWaiting(fourth, watch, "a fourth request while that probe is out")
	h.update(last.p, response(claim(b, routeCreate, major3), 200))
	h.granted(fourth, "a request after a probe passed")
	h.acquireNow(claim(a, routeCreate, major1))
}

// testBlockPaces: after a block, its route goes at nine tenths of what
// passed on it in the second before, one request per interval; other
// routes go on at once.
func testBlockPaces(h *harness) {
	h = h.with(store.Policy{BlockPause: time.Second})
	ctx := h.t.Context()
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 100, 99, far)
	for range 8 {
		h.update(h.acquireNow(c), limits(c, "h", 100, 90, far))
	}
	// Nine passed within the second: 8.1 per second, one per 124 ms.
	h.update(h.acquireNow(c), tooMany(c, store.ScopeBlocked, 0))
	probe := h.granted(h.acquireAsync(ctx, c), "the probe after the block")
	h.update(probe.p, limits(c, "h", 100, 90, far))

	const every, slack = 124 * time.Millisecond, 20 * time.Millisecond
	start, last := time.Now(), probe.at
	for i := range 4 {
		r := h.granted(h.acquireAsync(ctx, c), "a request after the block")
		if gap := r.at.Sub(last); gap < every-slack {
			h.t.Errorf("request %d after the block: %v after the one before; want at least %v", i+1, gap, every)
		}
		last = r.at
		h.update(r.p, limits(c, "h", 100, 90, far))
	}
	if d := time.Since(start); d > 4*every+time.Second {
		h.t.Errorf("four paced requests took %v; want about %v, not a second each", d, 4*every)
	}
	now := c
	now.NoWait = true
	h.update(h.acquireNow(c), limits(c, "h", 100, 90, far)) // waits out the pace
	_, err := h.s.Acquire(ctx, now)
	if we := h.waitError(err, store.ErrWaitTooLong, "a request the pace holds, NoWait"); we.Scope != store.ScopeBlocked || we.RetryAfter <= 0 {
		h.t.Errorf("a request the pace holds, NoWait: WaitError scope %q, retry after %v; want %q and a wait", we.Scope, we.RetryAfter, store.ScopeBlocked)
	}
	// Another route is not paced.
	other := claim(h.cred("a"), routeMe, "")
	for range 3 {
		r := h.acquireNow(other)
		if r.Waited > every/2 {
			h.t.Errorf("another route waited %v; want no pace", r.Waited)
		}
		h.update(r, response(other, 200))
	}
}

// testBlockedBan: a ban page, or blocks on two routes, hold every request
// of the store.
func testBlockedBan(h *harness) {
	h = h.with(store.Policy{BlockPause: time.Second})
	a, b := h.cred("a"), h.cred("b")
	c := claim(a, routeCreate, major1)
	u := tooMany(c, store.ScopeBlocked, 0)
	u.Ban = true
	h.update(h.acquireNow(c), u)
	other := claim(b, routeMe, "")
	other.NoWait = true
	_, err := h.s.Acquire(h.t.Context(), other)
	if we := h.waitError(err, store.ErrWaitTooLong, "another route during a ban"); we.Scope != store.ScopeBlocked {
		h.t.Errorf("another route during a ban: WaitError.Scope = %q; want %q", we.Scope, store.ScopeBlocked)
	}

	h = h.with(store.Policy{BlockPause: time.Second})
	h.update(h.acquireNow(claim(a, routeCreate, major1)), tooMany(c, store.ScopeBlocked, 0))
	h.acquireNow(other) // one blocked route holds only itself
	edit := claim(b, routeEdit, major1)
	h.update(h.acquireNow(edit), tooMany(edit, store.ScopeBlocked, 0))
	_, err = h.s.Acquire(h.t.Context(), other)
	h.waitError(err, store.ErrWaitTooLong, "a third route after blocks on two")
}

// testUnansweredKeepsWindow: a request sent but never answered after the
// window a response dated ended may have opened a window at Discord that
// no response dated: its bucket stays closed a whole window after it. One
// given up while that window lasted counted in it: the bucket reopens at
// its reset.
func testUnansweredKeepsWindow(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, 300*time.Millisecond)
	t0 := time.Now()
	p := h.acquireNow(c)
	time.Sleep(500 * time.Millisecond)
	h.update(p, store.Update{Sent: true}) // no response, after the dated window ended
	time.Sleep(time.Until(t0.Add(600 * time.Millisecond)))
	h.mustWait(c, watch) // the named reset (300 ms) has passed; the unanswered request's window (800 ms) has not

	d := claim(h.cred("b"), routeCreate, major1)
	h.learn(d, "h", 2, 1, time.Second)
	t0 = time.Now()
	p = h.acquireNow(d)
	time.Sleep(300 * time.Millisecond)
	h.update(p, store.Update{Sent: true}) // no response, within the dated window
	time.Sleep(time.Until(t0.Add(1200 * time.Millisecond)))
	h.acquireNow(d) // the named reset (1 s) has passed
}

// testUnsentGivesBackSlot: an Update with Sent false gives the slot back.
func testUnsentGivesBackSlot(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, far)
	p := h.acquireNow(c)
	h.mustWait(c, watch)
	h.update(p, unsent(c))
	h.acquireNow(c)
	h.mustWait(c, watch)

	// The probe of an unknown route.
	u := claim(c.Credential, routeList, major2)
	p = h.acquireNow(u)
	waiting := h.acquireAsync(h.t.Context(), u)
	waiting = h.stillWaiting(waiting, watch, "second request on an unknown route")
	h.update(p, unsent(u))
	h.granted(waiting, "request behind an unsent probe")
}

// testUnsentGivesBackGlobalSlot: an Update with Sent false gives back the
// request's place in the global window.
func testUnsentGivesBackGlobalSlot(h *harness) {
	g := h.globalClaim(h.cred("a"), 2)
	h.acquireNow(g)
	p := h.acquireNow(g)
	h.mustWait(g, watch)
	h.update(p, unsent(g))
	h.acquireNow(g)
}

// testSettleOnce: a reservation is settled once; a second Cancel or Report
// gives nothing back and says so.
func testSettleOnce(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, far)
	p := h.acquireNow(c)
	if p.Settled() {
		h.t.Errorf("new reservation reports Settled() = true")
	}
	p.Cancel()
	p.Cancel()
	if err := p.Report(h.t.Context(), limits(c, "h", 2, 1, far)); !errors.Is(err, store.ErrSettled) {
		h.t.Errorf("Report after Cancel = %v; want ErrSettled", err)
	}
	if !p.Settled() {
		h.t.Errorf("cancelled reservation reports Settled() = false")
	}
	// One slot came back, not two.
	q := h.acquireNow(c)
	h.mustWait(c, watch)
	h.update(q, limits(c, "h", 2, 0, far))
	if err := q.Report(h.t.Context(), unsent(c)); !errors.Is(err, store.ErrSettled) {
		h.t.Errorf("second Report = %v; want ErrSettled", err)
	}
	h.mustWait(c, watch)
}

// testNoWait: a claim that will not wait is granted when its request can
// go at once, and otherwise fails at once with ErrWaitTooLong and the
// estimated wait: on a spent bucket, behind a probe in flight, and on a
// spent global window.
func testNoWait(h *harness) {
	nowait := func(c store.Claim) store.Claim { c.NoWait = true; return c }
	refused := func(c store.Claim, wantRetry bool, what string) {
		h.t.Helper()
		ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
		defer cancel()
		t0 := time.Now()
		p, err := h.s.Acquire(ctx, nowait(c))
		if err == nil {
			h.t.Errorf("%s: NoWait claim granted; want ErrWaitTooLong", what)
			p.Cancel()
			return
		}
		if d := time.Since(t0); d > atOnce/2 {
			h.t.Errorf("%s: NoWait claim failed after %v; want at once", what, d)
		}
		we := h.waitError(err, store.ErrWaitTooLong, what)
		if wantRetry && (we.RetryAfter <= 0 || we.RetryAfter > far+time.Second) {
			h.t.Errorf("%s: RetryAfter = %v; want the wait, about %v", what, we.RetryAfter, far)
		}
	}

	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, far)
	h.update(h.acquireNow(nowait(c)), limits(c, "h", 2, 0, far)) // a slot left: granted
	refused(c, true, "spent bucket")
	// Past the deadline too: the error says both.
	ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
	_, err := h.s.Acquire(ctx, nowait(c))
	cancel()
	if !errors.Is(err, store.ErrWaitTooLong) || !errors.Is(err, context.DeadlineExceeded) {
		h.t.Errorf("NoWait claim whose wait passes its deadline: %v; want an error matching both ErrWaitTooLong and context.DeadlineExceeded", err)
	}

	probe := claim(c.Credential, routeList, major2)
	p := h.acquireNow(probe) // the route's first request probes it
	refused(probe, false, "behind a probe in flight")
	h.update(p, limits(probe, "list", 5, 4, far))
	h.update(h.acquireNow(nowait(probe)), limits(probe, "list", 5, 3, far))

	g := h.globalClaim(h.cred("b"), 1)
	h.acquireNow(nowait(g))
	refused(g, true, "spent global window")
}

// testEstimate: a store that estimates waits (store.Estimator) says how
// long a claim would wait without taking a slot: nothing on a bucket with
// room, about the reset on a spent bucket or global window, and the
// refusal Acquire would return.
func testEstimate(h *harness) {
	est, ok := h.s.(store.Estimator)
	if !ok {
		h.t.Skip("the store does not implement store.Estimator")
	}
	estimate := func(c store.Claim, what string) time.Duration {
		h.t.Helper()
		d, err := est.Estimate(h.t.Context(), c)
		if err != nil {
			h.t.Fatalf("%s: Estimate = %v; want a duration", what, err)
		}
		return d
	}
	about := func(d, want time.Duration, what string) {
		h.t.Helper()
		if d < want-time.Second || d > want+time.Second {
			h.t.Errorf("%s: Estimate = %v; want about %v", what, d, want)
		}
	}

	c := claim(h.cred("a"), routeCreate, major1)
	h.learn(c, "h", 2, 1, far)
	if d := estimate(c, "bucket with a slot left"); d != 0 {
		h.t.Errorf("bucket with a slot left: Estimate = %v; want 0", d)
	}
	h.update(h.acquireNow(c), limits(c, "h", 2, 0, far)) // the estimate took nothing
	about(estimate(c, "spent bucket"), far, "spent bucket")

	g := h.globalClaim(h.cred("b"), 1)
	h.acquireNow(g)
	about(estimate(g, "spent global window"), far, "spent global window")

	u := claim(h.cred("c"), routeCreate, major1)
	h.update(h.acquireNow(u), response(u, 401))
	if _, err := est.Estimate(h.t.Context(), u); !errors.Is(err, store.ErrUnauthorized) {
		h.t.Errorf("Estimate after a 401 = %v; want ErrUnauthorized", err)
	}
}

// testInvalidBudget: 401, 403 and non-shared 429 responses count against
// InvalidBudget; once it is spent, Acquire refuses. A negative budget
// disables the guard.
func testInvalidBudget(h *harness) {
	cred := h.cred("a")
	next := 0
	c := func() store.Claim {
		next++
		return claim(cred, routeCreate, fmt.Sprintf("channels/%d", next))
	}

	c1 := c()
	h.update(h.acquireNow(c1), response(c1, 403))
	c2 := c()
	h.update(h.acquireNow(c2), tooMany(c2, store.ScopeShared, 10*time.Millisecond)) // not counted
	c3 := c()
	h.update(h.acquireNow(c3), response(c3, 401)) // Cooldown -1: counted, not refused
	c4 := c()
	h.update(h.acquireNow(c4), tooMany(c4, store.ScopeUser, 10*time.Millisecond))

	c5 := c()
	ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
	defer cancel()
	p, err := h.s.Acquire(ctx, c5)
	if err == nil {
		h.update(p, unsent(c5))
		h.t.Fatalf("Acquire after 3 invalid responses with InvalidBudget 3 granted a permit")
	}
	we := h.waitError(err, store.ErrInvalidBudget, "spent invalid budget")
	if we.Scope != store.ScopeGuard {
		h.t.Errorf("WaitError.Scope = %q; want %q", we.Scope, store.ScopeGuard)
	}

	off := h.with(store.Policy{InvalidBudget: -1})
	for range 5 {
		cl := c()
		off.update(off.acquireNow(cl), response(cl, 403))
	}
	off.acquireNow(c())
}

// testUnauthorized: a 401 on the Authorization header makes the credential
// fail fast for Cooldown.
func testUnauthorized(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	h.update(h.acquireNow(c), response(c, 401))

	for _, cl := range []store.Claim{c, claim(c.Credential, routeMe, "")} {
		ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
		_, err := h.s.Acquire(ctx, cl)
		if err == nil {
			h.t.Errorf("Acquire(%s) after a 401 granted a permit; want ErrUnauthorized", describe(cl))
		} else {
			if ctx.Err() != nil {
				h.t.Errorf("Acquire(%s) after a 401 waited for the deadline; want it to fail at once", describe(cl))
			}
			we := h.waitError(err, store.ErrUnauthorized, describe(cl)+" after a 401")
			if we.Scope != store.ScopeGuard {
				h.t.Errorf("WaitError.Scope = %q; want %q", we.Scope, store.ScopeGuard)
			}
		}
		cancel()
	}
	h.acquireNow(claim(h.cred("b"), routeCreate, major1))

	// A 401 without a credential locks nothing: the next request without
	// one may need none.
	anon := claim(store.Unauthenticated, routeMe, "")
	h.update(h.acquireNow(anon), response(anon, 401))
	h.acquireNow(claim(store.Unauthenticated, "GET /gateway", ""))

	// Cooldown negative disables.
	off := h.with(store.Policy{Cooldown: -1})
	d := claim(h.cred("c"), routeCreate, major1)
	off.update(off.acquireNow(d), response(d, 401))
	off.acquireNow(d)

	// The cooldown ends.
	short := h.with(store.Policy{Cooldown: 100 * time.Millisecond})
	e := claim(h.cred("d"), routeCreate, major1)
	short.update(short.acquireNow(e), response(e, 401))
	time.Sleep(500 * time.Millisecond)
	short.acquireNow(e)
}

// testWebhookGone: a 404 or 401 on a token-authenticated route makes that
// major fail fast for Cooldown.
func testWebhookGone(h *harness) {
	cred := h.cred("a")
	hook := func(major string) store.Claim {
		c := claim(cred, routeHook, major)
		c.TokenAuth = true
		return c
	}
	for _, status := range []int{404, 401} {
		c := hook(fmt.Sprintf("webhooks/%d/token", status))
		h.update(h.acquireNow(c), response(c, status))

		ctx, cancel := context.WithTimeout(h.t.Context(), atOnce)
		_, err := h.s.Acquire(ctx, c)
		if err == nil {
			h.t.Errorf("Acquire on a webhook that answered %d granted a permit; want ErrWebhookGone", status)
		} else {
			if ctx.Err() != nil {
				h.t.Errorf("Acquire on a webhook that answered %d waited for the deadline; want it to fail at once", status)
			}
			we := h.waitError(err, store.ErrWebhookGone, fmt.Sprintf("webhook after %d", status))
			if we.Scope != store.ScopeGuard {
				h.t.Errorf("WaitError.Scope = %q; want %q", we.Scope, store.ScopeGuard)
			}
		}
		cancel()
	}
	h.acquireNow(hook("webhooks/2/other"))
	// Routes authenticated by the header are not affected.
	h.acquireNow(claim(cred, routeCreate, major1))

	// A 404 elsewhere is an ordinary answer.
	c := claim(h.cred("b"), routeEdit, major1)
	h.update(h.acquireNow(c), response(c, 404))
	h.acquireNow(c)

	// Cooldown negative disables.
	off := h.with(store.Policy{Cooldown: -1})
	d := hook("webhooks/3/token")
	off.update(off.acquireNow(d), response(d, 404))
	off.acquireNow(d)
}

// testClose: Close releases every waiter with ErrClosed, is idempotent, and
// refuses later requests.
func testClose(h *harness) {
	cred := h.cred("a")
	exhausted := claim(cred, routeCreate, major1)
	h.learn(exhausted, "h", 1, 0, far)
	probe := claim(cred, routeList, major2)
	h.acquireNow(probe)
	g := h.globalClaim(h.cred("b"), 1)
	h.acquireNow(g)

	var chans []<-chan result
	for _, c := range []store.Claim{exhausted, probe, g} {
		chans = append(chans, h.queue(h.t.Context(), c))
	}
	if err := h.s.Close(); err != nil {
		h.t.Errorf("Close() = %v; want nil", err)
	}
	if err := h.s.Close(); err != nil {
		h.t.Errorf("second Close() = %v; want nil", err)
	}
	for i, ch := range chans {
		what := fmt.Sprintf("waiter %d at Close", i)
		r := h.await(ch, what)
		if r.err == nil {
			h.t.Errorf("%s got a permit; want ErrClosed", what)
			continue
		}
		h.waitError(r.err, store.ErrClosed, what)
	}
	_, err := h.s.Acquire(h.t.Context(), claim(h.cred("c"), routeCreate, major1))
	if err == nil {
		h.t.Fatalf("Acquire after Close granted a permit; want ErrClosed")
	}
	h.waitError(err, store.ErrClosed, "Acquire after Close")
}

// testClaimDone: closing Claim.Done releases that waiter with ErrClosed and
// no other.
func testClaimDone(h *harness) {
	c := claim(h.cred("a"), routeCreate, major1)
	const reset = 400 * time.Millisecond
	t0 := time.Now()
	h.learn(c, "h", 1, 0, reset)

	done := make(chan struct{})
	withDone := c
	withDone.Done = done
	a := h.queue(h.t.Context(), withDone)
	b := h.queue(h.t.Context(), c)
	close(done)
	r := h.await(a, "waiter whose Done closed")
	if r.err == nil {
		h.t.Fatalf("waiter whose Done closed got a permit; want ErrClosed")
	}
	h.waitError(r.err, store.ErrClosed, "waiter whose Done closed")

	r = h.granted(b, "waiter behind a released one")
	h.notBefore(r, t0, reset, "waiter behind a released one")
}

// emulator plays one Discord bucket with fixed windows and counts requests
// that arrive beyond its limit.
type emulator struct {
	mu     sync.Mutex // guards every field below
	limit  int
	window time.Duration
	end    time.Time
	used   int
	over   int
}

// serve records a request arriving now and returns its response.
func (e *emulator) serve(c store.Claim) store.Update {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if !now.Before(e.end) {
		e.end, e.used = now.Add(e.window), 0
	}
	e.used++
	if e.used > e.limit {
		e.over++
	}
	// Reset-After has millisecond precision, rounded up here.
	after := (e.end.Sub(now) + time.Millisecond - 1).Truncate(time.Millisecond)
	return limits(c, "h", e.limit, max(0, e.limit-e.used), after)
}

// testHammer: many goroutines on one bucket never send more than its limit
// within one of Discord's windows.
func testHammer(h *harness) {
	const (
		workers = 50
		each    = 2
	)
	e := &emulator{limit: 10, window: 100 * time.Millisecond}
	c := claim(h.cred("a"), routeCreate, major1)
	ctx, cancel := context.WithTimeout(h.t.Context(), 2*eventually)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for i := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				p, err := h.s.Acquire(ctx, c)
				if err != nil {
					errs <- fmt.Errorf("worker %d: Acquire = %w", i, err)
					return
				}
				if err := p.Report(ctx, e.serve(c)); err != nil {
					errs <- fmt.Errorf("worker %d: Report = %w", i, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		h.t.Error(err)
	}
	if e.over > 0 {
		h.t.Errorf("%d requests arrived beyond the bucket's limit of %d per window", e.over, e.limit)
	}
}
