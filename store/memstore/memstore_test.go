package memstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, p store.Policy) store.Store { return New(WithPolicy(p)) })
}

// newFake returns a store on a fake clock, closed when the test ends.
func newFake(t *testing.T) (*Store, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(withClock(clk), WithPolicy(store.Policy{ResetOffset: -1})) // resets exactly as reported
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close() = %v; want nil", err)
		}
	})
	return s, clk
}

func claim(route, major string) store.Claim {
	return store.Claim{Credential: "bot", Route: route, Major: major}
}

func sent(c store.Claim, status int) store.Update {
	return store.Update{Sent: true, Status: status}
}

func headers(c store.Claim, bucket string, limit, remaining int, resetAfter time.Duration) store.Update {
	u := sent(c, 200)
	u.Bucket, u.HasLimit, u.Limit, u.Remaining, u.ResetAfter = bucket, true, limit, remaining, resetAfter
	return u
}

func acquire(t *testing.T, s *Store, c store.Claim) *store.Reservation {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	p, err := s.Acquire(ctx, c)
	if err != nil {
		t.Fatalf("Acquire(%s %s) = %v; want a permit at once", c.Route, c.Major, err)
	}
	return p
}

func update(t *testing.T, s *Store, p *store.Reservation, u store.Update) {
	t.Helper()
	if err := p.Report(t.Context(), u); err != nil {
		t.Fatalf("Report(%s %s) = %v; want nil", p.Claim.Route, p.Claim.Major, err)
	}
}

type result struct {
	p   *store.Reservation
	err error
}

func acquireAsync(t *testing.T, s *Store, c store.Claim) <-chan result {
	ch := make(chan result, 1)
	ctx := t.Context()
	go func() {
		p, err := s.Acquire(ctx, c)
		ch <- result{p, err}
	}()
	return ch
}

// pending asserts that an asynchronous Acquire has not returned. With a fake
// clock nothing opens by itself, so a short real-time look suffices.
func pending(t *testing.T, ch <-chan result, what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: Acquire returned (permit %+v, error %v); want it still waiting", what, r.p, r.err)
	case <-time.After(50 * time.Millisecond):
	}
}

// granted waits, in real time, for an asynchronous Acquire to succeed: timers
// of the fake clock fire in goroutines of their own.
func granted(t *testing.T, ch <-chan result, what string) *store.Reservation {
	t.Helper()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("%s: Acquire = %v; want a permit", what, r.err)
		}
		return r.p
	case <-time.After(5 * time.Second):
		t.Fatalf("%s: Acquire still blocked", what)
		return nil
	}
}

// waitFor polls cond in real time until it holds.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestMemoryBounded passes a stream of distinct interaction tokens, each a
// major of its own, and checks that idle buckets are swept as they go.
func TestMemoryBounded(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 50_000
	}
	s, clk := newFake(t)
	const (
		step  = time.Millisecond
		reset = 500 * time.Millisecond
		// bound is far above the live buckets (reset/step = 500) and the
		// sweep threshold, and far below n.
		bound = 4 * minSweep
	)
	routes := []struct {
		route, bucket string
		major         func(i int) string
	}{
		{"POST /interactions/:id/:token/callback", "cb", func(i int) string { return fmt.Sprintf("interactions/%d/tok%d", i, i) }},
		{"POST /webhooks/:id/:token", "wh", func(i int) string { return fmt.Sprintf("webhooks/42/tok%d", i) }},
		{"PATCH /webhooks/:id/:token/messages/:id", "wm", func(i int) string { return fmt.Sprintf("webhooks/42/tok%d", i) }},
	}
	maxLen := 0
	for i := range n {
		r := routes[i%len(routes)]
		c := claim(r.route, r.major(i))
		c.TokenAuth = true
		p, err := s.Acquire(t.Context(), c)
		if err != nil {
			t.Fatalf("request %d: Acquire = %v", i, err)
		}
		if err := p.Report(t.Context(), headers(c, r.bucket, 5, 4, reset)); err != nil {
			t.Fatalf("request %d: Update = %v", i, err)
		}
		clk.Advance(step)
		if l := s.Len(); l > maxLen {
			maxLen = l
			if l > bound {
				t.Fatalf("after %d requests on distinct majors, Len() = %d; want at most %d", i+1, l, bound)
			}
		}
	}
	t.Logf("%d requests, at most %d buckets held", n, maxLen)

	s.mu.Lock()
	defer s.mu.Unlock()
	if got := len(s.creds); got != 1 {
		t.Errorf("%d credentials held; want 1", got)
	}
	if cr := s.creds["bot"]; cr != nil && len(cr.routes) > len(routes) {
		t.Errorf("%d routes held; want at most %d", len(cr.routes), len(routes))
	}
}

// TestMemoryBoundedDistinctRoutes passes routes never seen twice, answered
// without rate-limit headers: their probe buckets are swept, and so are the
// routes once routeTTL has passed.
func TestMemoryBoundedDistinctRoutes(t *testing.T) {
	n := 50_000
	if testing.Short() {
		n = 20_000
	}
	s, clk := newFake(t)
	// At this pace routeTTL passes within the run.
	step := 2 * ms(routeTTL) / time.Duration(n)
	const bound = 4 * minSweep
	maxLen := 0
	for i := range n {
		c := claim(fmt.Sprintf("GET /odd/%d", i), "")
		p, err := s.Acquire(t.Context(), c)
		if err != nil {
			t.Fatalf("request %d: Acquire = %v", i, err)
		}
		if err := p.Report(t.Context(), sent(c, 200)); err != nil {
			t.Fatalf("request %d: Update = %v", i, err)
		}
		clk.Advance(step)
		if l := s.Len(); l > maxLen {
			maxLen = l
			if l > bound {
				t.Fatalf("after %d distinct routes, Len() = %d; want at most %d", i+1, l, bound)
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Routes seen within routeTTL, plus those seen before the last sweep.
	limit := int(ms(routeTTL)/step) + int(ms(sweepEvery)/step) + 1
	if cr := s.creds["bot"]; cr != nil && len(cr.routes) > limit {
		t.Errorf("%d routes held after %d distinct routes over %v; want at most %d", len(cr.routes), n, time.Duration(n)*step, limit)
	}
}

// TestBoundKeepsActiveState fills a store bounded to 100 credentials and
// routes with 2,000 credentials whose global windows are full, and 200
// more whose requests are still out. It keeps the 200 whole, beyond the
// bound, and folds the others into records (see fold.go), losing none; each
// still waits for its window; it sweeps now and then, not on every request;
// and once the windows have passed, the bound applies again and no record
// is left.
func TestBoundKeepsActiveState(t *testing.T) {
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(withClock(clk), WithMaxEntries(100))
	t.Cleanup(func() { s.Close() })
	const n, out = 2000, 200
	c := claim("POST /channels/:id/messages", "channels/1")
	c.Global, c.GlobalLimit = true, 1
	var outstanding []*store.Reservation
	for i := range n + out {
		c.Credential = fmt.Sprintf("cred-%d", i)
		p := acquire(t, s, c)
		if i < n {
			update(t, s, p, headers(c, "h", 5, 4, time.Second))
		} else {
			outstanding = append(outstanding, p)
		}
	}
	s.mu.Lock()
	s.sweep(s.now())
	creds, sweeps := len(s.creds), s.sweeps
	lost := 0
	for i := range n + out {
		id := fmt.Sprintf("cred-%d", i)
		_, folded := s.folds[s.digest(id)]
		if s.creds[id] == nil && (!folded || i >= n) {
			lost++
		}
	}
	s.mu.Unlock()
	if lost > 0 {
		t.Fatalf("%d of %d credentials whose windows are full neither held nor folded", lost, n+out)
	}
	if creds > out+100 {
		t.Errorf("%d credentials held whole with a bound of 100 and %d requests out; want at most %d", creds, out, out+100)
	}
	// A sweep comes no sooner than minSweep/4 additions to the store (a
	// credential adds its route and a bucket or two), not on every request.
	if most := 4 * (n + out) / (minSweep / 4); sweeps > most+1 {
		t.Errorf("%d sweeps for %d credentials; want at most %d", sweeps, n+out, most+1)
	}
	c.MaxWait = 10 * time.Millisecond
	for i := 0; i < n; i += 97 {
		c.Credential = fmt.Sprintf("cred-%d", i)
		_, err := s.Acquire(t.Context(), c)
		var we *store.WaitError
		if !errors.As(err, &we) || !errors.Is(err, store.ErrWaitTooLong) || we.Scope != store.ScopeGlobal {
			t.Fatalf("Acquire on %s, whose global window is full, beyond the bound = %v; want ErrWaitTooLong, scope global", c.Credential, err)
		}
	}
	for _, p := range outstanding {
		update(t, s, p, headers(p.Claim, "h", 5, 4, time.Second))
	}

	clk.Advance(2 * time.Second)
	c.MaxWait = 0
	c.Credential = "one more"
	update(t, s, acquire(t, s, c), headers(c, "h", 5, 4, time.Second))
	s.mu.Lock()
	s.sweep(s.now())
	held, folds := len(s.creds)+s.nroutes, len(s.folds)
	s.mu.Unlock()
	if held > 100 || folds > 0 {
		t.Errorf("%d credentials and routes held and %d records once the windows passed; want at most 100 and none", held, folds)
	}
}

// TestIdleRoutesForgotten passes 5,000 credentials, one request each, then
// a bot that sends on 100 routes, and lets the store idle: within 21 s it
// keeps no more than 1,024 routes (its idle share, at the default bound),
// the bot's among them, and the credentials of the burst are gone; the
// bot's routes stay known after a minute more.
func TestIdleRoutesForgotten(t *testing.T) {
	s, clk := newFake(t)
	const burst, routes, most = 5000, 100, DefaultMaxEntries / 32
	for i := range burst {
		c := claim("POST /channels/:id/messages", "channels/1")
		c.Credential, c.Global = fmt.Sprintf("cred-%d", i), true
		update(t, s, acquire(t, s, c), headers(c, "h", 5, 4, time.Second))
	}
	clk.Advance(time.Second)
	for i := range routes {
		c := claim(fmt.Sprintf("GET /r%d", i), "")
		update(t, s, acquire(t, s, c), headers(c, fmt.Sprint("b", i), 5, 4, time.Second))
	}
	idle := func(d time.Duration) {
		for range d / time.Second {
			clk.Advance(time.Second)
			waitFor(t, func() bool { return clk.Timers() > 0 }, "the sweep timer")
		}
	}
	held := func() (creds, nroutes, bot int) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if cr := s.creds["bot"]; cr != nil {
			bot = len(cr.routes)
		}
		return len(s.creds), s.nroutes, bot
	}
	idle(21 * time.Second)
	creds, nroutes, bot := held()
	if nroutes > most || creds > most+1 || bot != routes {
		t.Errorf("21s idle after %d credentials: %d credentials and %d routes held, %d of the bot's; want at most %d, and all %d",
			burst, creds, nroutes, bot, most, routes)
	}
	idle(time.Minute)
	if _, _, bot := held(); bot != routes {
		t.Errorf("after a minute more, %d of the bot's %d routes held; want all", bot, routes)
	}
}

// TestGlobalWindowExact checks the sliding global window to the millisecond.
func TestGlobalWindowExact(t *testing.T) {
	s, clk := newFake(t)
	c := claim("POST /channels/:id/messages", "channels/1")
	update(t, s, acquire(t, s, c), headers(c, "h", 1000, 999, time.Hour)) // not global
	g := c
	g.Global, g.GlobalLimit = true, 3

	// Grants at 0, 400 ms and 800 ms fill the window.
	for i := range 3 {
		if i > 0 {
			clk.Advance(400 * time.Millisecond)
		}
		update(t, s, acquire(t, s, g), headers(g, "h", 1000, 999, time.Hour))
	}

	// The 4th may go when the grant at 0 leaves the window, at 1000 ms; the
	// 5th when the grant at 400 ms leaves, at 1400 ms.
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{
		{"4th request", 200 * time.Millisecond},
		{"5th request", 400 * time.Millisecond},
	} {
		armed := clk.Timers() // the store's sweep timer
		ch := acquireAsync(t, s, g)
		waitFor(t, func() bool { return clk.Timers() > armed }, tc.name+" to arm the global timer")
		clk.Advance(tc.wait - time.Millisecond)
		pending(t, ch, tc.name+" 1 ms before the window slides")
		clk.Advance(time.Millisecond)
		p := granted(t, ch, tc.name+" when the window slides")
		if p.Waited != tc.wait {
			t.Errorf("%s: Permit.Waited = %v; want %v", tc.name, p.Waited, tc.wait)
		}
		update(t, s, p, headers(g, "h", 1000, 999, time.Hour))
	}

	// The window is full again until 1800 ms: a MaxWait shorter than that
	// fails at once, with the exact wait.
	g.MaxWait = 100 * time.Millisecond
	_, err := s.Acquire(t.Context(), g)
	if err == nil {
		t.Fatalf("Acquire with a full global window granted a permit")
	}
	var we *store.WaitError
	if !errors.As(err, &we) || !errors.Is(err, store.ErrWaitTooLong) || we.Scope != store.ScopeGlobal || we.RetryAfter != 400*time.Millisecond {
		t.Errorf("Acquire with a full global window = %v; want a WaitError wrapping ErrWaitTooLong, scope global, RetryAfter 400ms", err)
	}
}

// TestRefillCarriesRequestsInFlight checks that a bucket whose dated reset
// has passed refills less a slot for each request still in flight, which
// may arrive at Discord in the new window; that a response dated the ended
// window (on Discord's clock, however late it is read) gives its slot back;
// and that one without headers does not.
func TestRefillCarriesRequestsInFlight(t *testing.T) {
	s, clk := newFake(t)
	c := claim("POST /channels/:id/messages", "channels/1")
	end := time.Unix(1_800_000_000, 0) // the window's end on Discord's clock
	dated := func(remaining int, after time.Duration) store.Update {
		u := headers(c, "h", 3, remaining, after)
		u.Reset = end
		return u
	}
	update(t, s, acquire(t, s, c), dated(2, time.Second))
	p1 := acquire(t, s, c)
	p2 := acquire(t, s, c)

	clk.Advance(2 * time.Second)
	acquire(t, s, c) // three, less the two in flight
	ch := acquireAsync(t, s, c)
	pending(t, ch, "request with two of the last window's requests in flight")

	update(t, s, p1, sent(c, 500)) // no rate-limit headers: it may have counted in the new window
	pending(t, ch, "request after a response without headers")

	update(t, s, p2, dated(0, 0)) // it arrived in the window that ended, read a second after its end
	p := granted(t, ch, "request once a response of the ended window gave its slot back")
	if p.Bucket != "h" {
		t.Errorf("Permit.Bucket = %q; want %q", p.Bucket, "h")
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if _, err := s.Acquire(ctx, c); err == nil {
		t.Errorf("4th request of a window of 3 granted (its slots: p1's, and the two granted in it)")
	}
}

// TestLateReportInNewWindow checks that a response reported after the reset
// that dates a later window than the one that ended (on the store's clock:
// it has no X-RateLimit-Reset) closes the bucket until the reset it names.
func TestLateReportInNewWindow(t *testing.T) {
	s, clk := newFake(t)
	c := claim("POST /channels/:id/messages", "channels/1")
	update(t, s, acquire(t, s, c), headers(c, "h", 2, 1, time.Second))
	p1 := acquire(t, s, c)

	clk.Advance(2 * time.Second)
	acquire(t, s, c) // two, less the one in flight
	ch := acquireAsync(t, s, c)
	pending(t, ch, "request with the new window's free slot taken")

	update(t, s, p1, headers(c, "h", 2, 0, 500*time.Millisecond))
	pending(t, ch, "request before the reported reset")
	clk.Advance(499 * time.Millisecond)
	pending(t, ch, "request 1 ms before the reported reset")
	clk.Advance(time.Millisecond)
	granted(t, ch, "request at the reported reset")
}

// BenchmarkAcquireUpdate measures a request on a known bucket with room to
// spare, from many goroutines.
func BenchmarkAcquireUpdate(b *testing.B) {
	s := New()
	defer s.Close()
	const plenty = 1 << 40
	c := claim("POST /channels/:id/messages", "channels/1")
	ctx := context.Background()
	p, err := s.Acquire(ctx, c)
	if err != nil {
		b.Fatal(err)
	}
	u := headers(c, "h", plenty, plenty-1, time.Hour)
	if err := p.Report(ctx, u); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := s.Acquire(ctx, c)
			if err != nil {
				b.Error(err)
				return
			}
			if err := p.Report(ctx, u); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// burst learns a bucket of limit 10 per second from a first request, then
// sends 9 more at once and reports their responses in the order given,
// with the headers the bucket's kind would send (each response processed
// 1 ms after the previous one).
func burst(t *testing.T, s *Store, clk *clock.Fake, c store.Claim, sliding bool, order []int) {
	t.Helper()
	const limit, window = 10, time.Second
	tau := window / limit
	resetAfter := func(counted int) time.Duration {
		if sliding {
			return time.Duration(counted) * tau // level * window/limit
		}
		return window - time.Duration(counted-1)*time.Millisecond
	}
	update(t, s, acquire(t, s, c), headers(c, "h", limit, limit-1, resetAfter(1)))
	var permits []*store.Reservation
	for range limit - 1 {
		permits = append(permits, acquire(t, s, c))
	}
	clk.Advance(10 * time.Millisecond)
	for _, i := range order {
		counted := i + 2
		update(t, s, permits[i], headers(c, "h", limit, limit-counted, resetAfter(counted)-10*time.Millisecond))
	}
}

func TestSlidingBucketDrips(t *testing.T) {
	t.Parallel()
	order := []int{3, 0, 8, 5, 1, 7, 2, 6, 4} // responses arrive out of order
	s, clk := newFake(t)
	c := claim("POST /channels/:id/messages", "channels/1")
	burst(t, s, clk, c, true, order)
	next := acquireAsync(t, s, c)
	pending(t, next, "request on a full sliding bucket")
	// One slot drains after window/limit (100 ms), plus margins: well
	// before the bucket is empty again (1 s).
	for range 30 {
		clk.Advance(10 * time.Millisecond)
		select {
		case r := <-next:
			if r.err != nil {
				t.Fatalf("Acquire = %v", r.err)
			}
			if s.creds["bot"].buckets[bkey{hash: "h", major: "channels/1"}] == nil {
				t.Fatal("bucket missing")
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no slot came back within 300 ms of a sliding bucket draining one per 100 ms")
}

// TestSlidingInFlightDrainsOnceArrived: requests in flight on a sliding
// bucket hold their slots whole only until they have surely reached
// Discord (the hold after their grant) and a running process would have
// reported them (the report slack after that); then they drain like
// answered ones, from the hold on, whether or not their responses are
// ever read (a process stopped or starved with requests in flight).
func TestSlidingInFlightDrainsOnceArrived(t *testing.T) {
	t.Parallel()
	s, clk := newFake(t)
	c := claim("POST /channels/:id/messages", "channels/1")
	burst(t, s, clk, c, true, []int{0, 1, 2, 3, 4, 5, 6, 7, 8})
	clk.Advance(2 * time.Second) // drained
	var out []*store.Reservation
	var next <-chan result
	for next == nil && len(out) < 20 {
		ch := acquireAsync(t, s, c)
		select {
		case r := <-ch:
			if r.err != nil {
				t.Fatalf("Acquire = %v", r.err)
			}
			out = append(out, r.p)
		case <-time.After(50 * time.Millisecond):
			next = ch
		}
	}
	if next == nil || len(out) < 2 {
		t.Fatalf("%d grants on a drained bucket of 10 and no wait; want the bucket filled, then a wait", len(out))
	}
	// Never answered, the requests count whole until the hold (250 ms)
	// has passed, by when any of them has reached Discord, and the
	// report slack (250 ms) after it, by when a running process would
	// have reported them.
	clk.Advance(490 * time.Millisecond)
	pending(t, next, "request while the requests in flight may not have arrived, or may yet be reported")
	// Counted as arrived at 250 ms, they drain one per tau (the longest
	// the responses showed a slot takes, about 100 ms) from then: the
	// bucket has a slot once its level is limit-1.
	s.mu.Lock()
	tau := time.Duration(s.creds["bot"].buckets[bkey{hash: "h", major: "channels/1"}].Tau()) * time.Microsecond
	s.mu.Unlock()
	opens := max(500*time.Millisecond, 250*time.Millisecond+time.Duration(len(out)-9)*tau)
	clk.Advance(opens - 490*time.Millisecond - 5*time.Millisecond)
	pending(t, next, "request before the aged requests drained a slot")
	clk.Advance(10 * time.Millisecond)
	granted(t, next, "request once the unanswered requests drained a slot")
	for _, p := range out {
		update(t, s, p, sent(c, 200))
	}
}

func TestFixedBucketDoesNotDrip(t *testing.T) {
	t.Parallel()
	order := []int{3, 0, 8, 5, 1, 7, 2, 6, 4}
	s, clk := newFake(t)
	c := claim("POST /channels/:id/messages", "channels/1")
	burst(t, s, clk, c, false, order)
	next := acquireAsync(t, s, c)
	for range 9 {
		clk.Advance(100 * time.Millisecond)
		pending(t, next, "request on a full fixed bucket before its reset")
	}
	clk.Advance(150 * time.Millisecond)
	granted(t, next, "request after the fixed window's reset")
}

// TestDeadWebhooksBounded checks that webhooks on cooldown stay bounded per
// credential however many distinct ones answer 404.
func TestDeadWebhooksBounded(t *testing.T) {
	t.Parallel()
	s, _ := newFake(t)
	for i := range maxDead + 500 {
		c := store.Claim{Credential: "bot", Route: "POST /webhooks/:id/:token", Major: fmt.Sprintf("webhooks/%d/h", i), TokenAuth: true}
		update(t, s, acquire(t, s, c), sent(c, 404))
	}
	s.mu.Lock()
	n := len(s.creds["bot"].dead)
	s.mu.Unlock()
	if n > maxDead {
		t.Errorf("%d webhooks on cooldown kept; want at most %d", n, maxDead)
	}
	if n < maxDead/2 {
		t.Errorf("%d webhooks on cooldown kept; want the most recent ones, about %d", n, maxDead)
	}
}

// TestSublimitsBounded: a credential keeps at most maxSubs hidden
// sublimits; beyond it, a sublimit's 429 pauses its whole bucket instead.
func TestSublimitsBounded(t *testing.T) {
	t.Parallel()
	s, _ := newFake(t)
	rename := func(i int) store.Claim {
		return store.Claim{Credential: "bot", Route: "PATCH /channels/:id", Major: fmt.Sprintf("channels/%d", i), Kind: "rename"}
	}
	limited := func(c store.Claim) store.Update {
		u := headers(c, "e", 5, 3, time.Second)
		u.Status, u.Scope, u.RetryAfter = 429, store.ScopeUser, 10*time.Minute
		return u
	}
	for i := range maxSubs + 10 {
		c := rename(i)
		update(t, s, acquire(t, s, c), limited(c))
	}
	s.mu.Lock()
	n := len(s.creds["bot"].subs)
	s.mu.Unlock()
	if n > maxSubs {
		t.Errorf("%d sublimits kept; want at most %d", n, maxSubs)
	}
	// The last ones, beyond the bound, paused their buckets: another edit
	// of that channel waits too.
	edit := rename(maxSubs + 9)
	edit.Kind = ""
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(ctx, edit); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire(an edit of a channel whose sublimit was not kept) = %v; want it to wait for the pause", err)
	}
}
