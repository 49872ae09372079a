package edge

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
)

const route = "GET /channels/:id/messages"

func newGates(t *testing.T) (*Gates, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	g := New(clk, time.Second, time.Minute, "", nil, nil, 0)
	t.Cleanup(g.Close)
	return g, clk
}

// pass reports n requests of route that passed the edge, claimed at the
// clock's time (as Acquire notes the slot of each claim's arrival), then
// moves the clock by d.
func pass(g *Gates, clk *clock.Fake, route string, n int, d time.Duration) {
	g.slot.Store(slotOf(clk.Now()))
	for range n {
		g.Settle(&store.Reservation{}, &store.Claim{Route: route}, &store.Update{Sent: true, Status: 200})
	}
	clk.Advance(d)
}

// probePassed ends the gate of route, as its probe's passing does.
func probePassed(g *Gates, route string) {
	g.mu.Lock()
	delete(g.gates, route)
	g.broadcast()
	g.mu.Unlock()
}

func block(g *Gates, route string) {
	g.Settle(&store.Reservation{}, &store.Claim{Route: route}, &store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked})
}

func TestPassesCountTheLastWindow(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 5, 600*time.Millisecond) // falls out of the window below
	pass(g, clk, route, 8, 300*time.Millisecond)
	pass(g, clk, "GET /users/@me", 3, 300*time.Millisecond)
	now := clk.Now()
	if got := g.passed.count(route, now); got != 8 {
		t.Errorf("count(route) = %d; want the 8 of the last second", got)
	}
	if got := g.passed.count(All, now); got != 11 {
		t.Errorf("count(All) = %d; want 11, every route's", got)
	}
	// A slot reused after its ring turned over counts anew.
	clk.Advance(slots * slotWidth)
	pass(g, clk, route, 2, 0)
	if got := g.passed.count(route, clk.Now()); got != 2 {
		t.Errorf("count after the ring turned over = %d; want 2", got)
	}
}

// TestAcquireDatesPasses: a response is counted in the slot of the latest
// claim's arrival.
func TestAcquireDatesPasses(t *testing.T) {
	g, clk := newGates(t)
	clk.Advance(time.Hour)
	c := store.Claim{Route: route}
	r, err := g.Acquire(context.Background(), c, clk.Now(), nil, func(store.Claim) (*store.Reservation, error) {
		return &store.Reservation{}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	g.Settle(r, &c, &store.Update{Sent: true, Status: 200})
	g.Settle(r, &c, &store.Update{Sent: true, Status: 0}) // no answer: not counted
	g.Settle(r, &c, &store.Update{Sent: false})           // not sent: not counted
	if got := g.passed.count(route, clk.Now()); got != 1 {
		t.Errorf("count after one answered request = %d; want 1", got)
	}
}

func TestPassesBounded(t *testing.T) {
	g, clk := newGates(t)
	for i := range maxCounted + 50 {
		pass(g, clk, "GET /r"+strconv.Itoa(i), 1, 0)
	}
	if n := g.passed.n.Load(); n > maxCounted {
		t.Errorf("%d routes counted one by one; want at most %d", n, maxCounted)
	}
	// A route beyond the bound learns from the whole store's count.
	if got := g.passed.count("GET /r"+strconv.Itoa(maxCounted+10), clk.Now()); got != maxCounted+50 {
		t.Errorf("count(a route beyond the bound) = %d; want the store's %d", got, maxCounted+50)
	}
}

func TestBlockLearnsAPace(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 20, 10*time.Millisecond)
	block(g, route)
	if got, want := g.paceOf(route), 56*time.Millisecond; got != want {
		t.Errorf("Pace after 20 passed = %v; want %v (18 per second, rounded up to the millisecond)", got, want)
	}
	// More blocks of the same episode, before the pace let anything out,
	// change nothing.
	block(g, route)
	if got := g.paceOf(route); got != 56*time.Millisecond {
		t.Errorf("Pace after a second block response of the same episode = %v; want it unchanged", got)
	}
	if g.paceOf("GET /users/@me") != 0 || g.paceOf(All) != 0 {
		t.Error("a block of one route paced others")
	}
}

// TestBlockWhilePacedLowersTheRate: a block soon after the pace was set
// takes a tenth off it (the count it came from was one off); a block at a
// rate that had run clean for RaiseAfter halves it.
func TestBlockWhilePacedLowersTheRate(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		clean time.Duration // how long the pace ran before the block
		want  time.Duration
	}{
		{"soon after", time.Second, 155 * time.Millisecond}, // 6.48 per second
		{"after running clean", RaiseAfter, 278 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, clk := newGates(t)
			pass(g, clk, route, 8, 10*time.Millisecond) // 7.2 per second: 139 ms
			block(g, route)
			clk.Advance(tc.clean)
			probePassed(g, route)
			if err := g.awaitPace(ctx, store.Claim{Route: route}, false, nil); err != nil {
				t.Fatal(err)
			}
			pass(g, clk, route, 1, 0)
			block(g, route)
			if got := g.paceOf(route); got != tc.want {
				t.Errorf("Pace after a block under a pace of %v = %v; want %v", 139*time.Millisecond, got, tc.want)
			}
		})
	}
}

// TestPaceCountsAnswersAfterTheBlock: requests sent before a block whose
// answers came after it passed too; the first request the pace lets out
// counts them. Answers that come later than that, or a pause too long for
// the count to be kept, change nothing.
func TestPaceCountsAnswersAfterTheBlock(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 8, 10*time.Millisecond)
	block(g, route) // 7.2 per second: 139 ms
	pass(g, clk, route, 3, 50*time.Millisecond)
	clk.Advance(time.Second)
	if got, want := g.paceOf(route), 139*time.Millisecond; got != want {
		t.Fatalf("pace before it let a request out = %v; want %v", got, want)
	}
	probePassed(g, route)
	if err := g.awaitPace(context.Background(), store.Claim{Route: route}, false, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := g.paceOf(route), 112*time.Millisecond; got != want {
		t.Errorf("pace once eleven had passed = %v; want %v (9 per second: ten, one being for the network's bunching)", got, want)
	}

	// A pause longer than the passes are kept: the count at the block stays.
	g2, clk2 := newGates(t)
	pass(g2, clk2, route, 8, 10*time.Millisecond)
	block(g2, route)
	pass(g2, clk2, route, 2, 50*time.Millisecond)
	clk2.Advance(4 * time.Second)
	probePassed(g2, route)
	if err := g2.awaitPace(context.Background(), store.Claim{Route: route}, false, nil); err != nil {
		t.Fatal(err)
	}
	if got, want := g2.paceOf(route), 139*time.Millisecond; got != want {
		t.Errorf("pace after a 4 s pause = %v; want %v, what the block counted", got, want)
	}
}

// TestPaceOfAnswersInFlightAtTheBlock: a block met, or heard of from
// another process, before any answer of this process's requests came
// paces nothing at once. The first request after the pause counts the
// answers of the requests that were in flight at the block: if some
// passed, the process is paced by them (one request per window at least);
// if none did, it sent nothing there and stays unpaced.
func TestPaceOfAnswersInFlightAtTheBlock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		heard  bool // the block came from another process
		passed int  // answers of requests in flight at the block that passed
		want   time.Duration
	}{
		{"met, four passed", false, 4, 371 * time.Millisecond}, // 3 (one less) × 0.9 per second
		{"heard, four passed", true, 4, 371 * time.Millisecond},
		{"met, one passed", false, 1, 1112 * time.Millisecond}, // at least one per window
		{"met, none passed", false, 0, 0},
		{"heard, none passed", true, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, clk := newGates(t)
			if tc.heard {
				g.Merge([]State{{Key: route, Until: time.Second}}, clk.Now())
			} else {
				block(g, route)
			}
			if got := g.paceOf(route); got != 0 {
				t.Fatalf("pace before any answer was counted = %v; want none yet", got)
			}
			pass(g, clk, route, tc.passed, 50*time.Millisecond)
			clk.Advance(time.Second)
			probePassed(g, route)
			if err := g.awaitPace(context.Background(), store.Claim{Route: route}, false, nil); err != nil {
				t.Fatal(err)
			}
			if got := g.paceOf(route); got != tc.want {
				t.Errorf("pace after the first request = %v; want %v", got, tc.want)
			}
			g.mu.Lock()
			n := len(g.paces)
			g.mu.Unlock()
			if tc.want == 0 && (n != 0 || g.Active()) {
				t.Errorf("%d paces kept, Active %v, with nothing passed; want none", n, g.Active())
			}
			if tc.want == 0 {
				return
			}
			// The pace holds the next request for its interval.
			err := g.awaitPace(context.Background(), store.Claim{Route: route, NoWait: true}, false, nil)
			var we *store.WaitError
			if !errors.As(err, &we) || we.RetryAfter != tc.want {
				t.Errorf("next claim = %v; want held for %v", err, tc.want)
			}
		})
	}
}

func TestPaceForgotten(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 8, 0)
	block(g, route)
	clk.Advance(PaceMemory)
	if got := g.paceOf(route); got != 0 {
		t.Errorf("Pace after PaceMemory = %v; want it forgotten", got)
	}
	probePassed(g, route)
	if err := g.awaitPace(context.Background(), store.Claim{Route: route}, false, nil); err != nil {
		t.Fatal(err)
	}
	g.mu.Lock()
	n := len(g.paces)
	g.mu.Unlock()
	if n != 0 || g.Active() {
		t.Errorf("%d paces kept, Active %v, after PaceMemory; want none", n, g.Active())
	}
}

// TestAwaitPaceSpaces: claims go one per interval in arrival order; a
// claim that cannot wait fails at once with the wait; a closed store
// releases the waiters.
func TestAwaitPaceSpaces(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 4, 0) // 3.6 per second
	block(g, route)
	probePassed(g, route)
	ctx := context.Background()
	c := store.Claim{Route: route}
	if err := g.awaitPace(ctx, c, false, nil); err != nil {
		t.Fatal(err)
	}
	now := c
	now.NoWait = true
	err := g.awaitPace(ctx, now, false, nil)
	var we *store.WaitError
	if !errors.As(err, &we) || !errors.Is(err, store.ErrWaitTooLong) || we.Scope != store.ScopeBlocked || we.RetryAfter != 278*time.Millisecond {
		t.Fatalf("awaitPace(NoWait) = %v; want ErrWaitTooLong, scope blocked, retry after 278ms", err)
	}

	done := make(chan error, 2)
	go func() { done <- g.awaitPace(ctx, c, false, nil) }()
	for clk.Timers() == 0 {
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		t.Fatalf("awaitPace returned %v before the interval", err)
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(278 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	closed := make(chan struct{})
	go func() { done <- g.awaitPace(ctx, c, false, closed) }()
	for clk.Timers() == 0 {
		time.Sleep(time.Millisecond)
	}
	close(closed)
	if err := <-done; !errors.Is(err, store.ErrClosed) {
		t.Errorf("awaitPace after the store closed = %v; want ErrClosed", err)
	}
}

func TestPacesBounded(t *testing.T) {
	g, clk := newGates(t)
	for i := range maxPaces + 5 {
		r := "GET /r" + strconv.Itoa(i)
		pass(g, clk, r, 4, 0)
		block(g, r)
		g.mu.Lock()
		clear(g.gates) // each block passed
		g.broadcast()
		g.mu.Unlock()
	}
	g.mu.Lock()
	n := len(g.paces)
	_, all := g.paces[All]
	g.mu.Unlock()
	if n > maxPaces+1 || !all {
		t.Errorf("%d paces kept (the store's: %v); want at most %d routes, then the whole store paced", n, all, maxPaces)
	}
}

// TestPacesOfOtherRoutesForgotten: once every pace ran out, the store
// takes the fast path again, whatever route comes next.
func TestPacesOfOtherRoutesForgotten(t *testing.T) {
	g, clk := newGates(t)
	other := "GET /users/@me"
	pass(g, clk, other, 8, 0)
	block(g, other)
	g.mu.Lock()
	clear(g.gates)
	g.broadcast()
	g.mu.Unlock()
	clk.Advance(PaceMemory)
	if err := g.awaitPace(context.Background(), store.Claim{Route: route}, false, nil); err != nil {
		t.Fatal(err)
	}
	if g.Active() {
		t.Error("Active after every pace ran out; want the fast path")
	}
}

// clockLapser settles reservations by counting those given back, and
// lapses them on a fake clock.
type clockLapser struct {
	clk      *clock.Fake
	returned int
}

func (l *clockLapser) Settle(_ context.Context, _ *store.Reservation, u store.Update) error {
	if !u.Sent {
		l.returned++
	}
	return nil
}

func (l *clockLapser) Lapsed(r *store.Reservation) bool { return l.clk.Now().After(r.SendBy) }

// pacedLapsing returns gates whose route is paced at 3.6 per second (one
// request every 278 ms) after a block, and a settler that lapses grants on
// their clock.
func pacedLapsing(t *testing.T) (*Gates, *clock.Fake, *clockLapser) {
	t.Helper()
	g, clk := newGates(t)
	pass(g, clk, route, 4, 0)
	block(g, route)
	probePassed(g, route)
	return g, clk, &clockLapser{clk: clk}
}

// TestPacedGrantIsFresh: a claim whose pace outlasts its grant's life (see
// store.Reservation.SendBy) gives the grant back and takes a fresh one
// once the pace lets it go, rather than hand out a grant that lapsed.
func TestPacedGrantIsFresh(t *testing.T) {
	g, clk, l := pacedLapsing(t)
	acquired := 0
	acquire := func(c store.Claim) (*store.Reservation, error) {
		acquired++
		r := store.NewReservation(l, c, "", 0, nil, 0)
		r.SendBy = clk.Now().Add(125 * time.Millisecond)
		return r, nil
	}
	ctx := context.Background()
	c := store.Claim{Route: route}
	first, err := g.Acquire(ctx, c, clk.Now(), nil, acquire)
	if err != nil {
		t.Fatal(err)
	}
	first.Cancel()

	type result struct {
		r   *store.Reservation
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := g.Acquire(ctx, c, clk.Now(), nil, acquire)
		done <- result{r, err}
	}()
	for clk.Timers() == 0 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(278 * time.Millisecond)
	res := <-done
	if res.err != nil {
		t.Fatal(res.err)
	}
	if res.r.Lapsed() {
		t.Fatalf("the paced claim's grant lapsed (SendBy %v, now %v); want a fresh one", res.r.SendBy, clk.Now())
	}
	if acquired != 3 || l.returned != 2 {
		t.Fatalf("%d grants taken, %d given back; want 3 and 2 (the first claim's, and the paced claim's lapsed one)", acquired, l.returned)
	}
}

// TestPacedGrantClaimedAgainAfterAWaitIsPacedAgain: claims the pace let
// out on lapsed grants whose fresh grants had to wait (their bucket was
// full) do not go together when their bucket lets them: one whose turn
// another claim's followed goes through the pace again, in its place in
// line.
// Requests let out apart and then held by their bucket would otherwise
// leave together at its reset, and bunch into a window of the edge. A
// claim whose turn nobody followed gives it back and goes at once.
func TestPacedGrantClaimedAgainAfterAWaitIsPacedAgain(t *testing.T) {
	g, clk, l := pacedLapsing(t)
	var mu sync.Mutex
	calls := map[string]int{}
	bucket := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	acquire := func(c store.Claim) (*store.Reservation, error) {
		mu.Lock()
		calls[c.Major]++
		n := calls[c.Major]
		mu.Unlock()
		if n == 2 && c.Major != "" {
			<-bucket[c.Major] // claimed again: its bucket holds it
		}
		r := store.NewReservation(l, c, "", 0, nil, 0)
		r.SendBy = clk.Now().Add(125 * time.Millisecond)
		return r, nil
	}
	called := func(major string) int {
		mu.Lock()
		defer mu.Unlock()
		return calls[major]
	}
	ctx := context.Background()
	first, err := g.Acquire(ctx, store.Claim{Route: route}, clk.Now(), nil, acquire)
	if err != nil {
		t.Fatal(err)
	}
	first.Cancel()
	start := clk.Now()

	type result struct {
		major string
		at    time.Duration
		err   error
	}
	done := make(chan result, 2)
	for _, major := range []string{"a", "b"} {
		go func() {
			r, err := g.Acquire(ctx, store.Claim{Route: route, Major: major}, clk.Now(), nil, acquire)
			if err == nil && r.Lapsed() {
				err = errors.New("lapsed grant")
			}
			done <- result{major, clk.Now().Sub(start), err}
		}()
		for called(major) == 0 || clk.Timers() == 0 {
			time.Sleep(time.Millisecond)
		}
	}
	// a's turn at 278 ms: its grant lapsed, the fresh one waits; b's turn
	// at 556 ms: the same.
	for _, major := range []string{"a", "b"} {
		clk.Advance(278 * time.Millisecond)
		for called(major) < 2 {
			time.Sleep(time.Millisecond)
		}
	}
	// The bucket's reset lets both go at once.
	close(bucket["a"])
	close(bucket["b"])
	got := <-done
	if got.err != nil || got.major != "b" || got.at != 556*time.Millisecond {
		t.Fatalf("first to go: %+v; want b at 556ms, its turn followed by none", got)
	}
	select {
	case got := <-done:
		t.Fatalf("%+v went together with b; want a paced again", got)
	case <-time.After(20 * time.Millisecond):
	}
	for clk.Timers() == 0 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(278 * time.Millisecond)
	if got := <-done; got.err != nil || got.major != "a" || got.at != 834*time.Millisecond {
		t.Fatalf("second to go: %+v; want a at 834ms, the pace's next turn", got)
	}
}

// letOut has the pace of route hold a claim back (one that will not wait)
// and then let one out when its turn comes, n times, advancing the clock.
func letOut(t *testing.T, g *Gates, clk *clock.Fake, n int) {
	t.Helper()
	ctx := context.Background()
	for range n {
		clk.Advance(g.paceOf(route))
		if err := g.awaitPace(ctx, store.Claim{Route: route}, false, nil); err != nil {
			t.Fatal(err)
		}
		pass(g, clk, route, 1, 0)
		if err := g.awaitPace(ctx, store.Claim{Route: route, NoWait: true}, false, nil); err == nil {
			t.Fatal("a claim went out ahead of the pace")
		}
	}
}

// TestPaceProbesUpward: a pace that ran clean while it held requests back
// lets one more through per window: after RaiseAfter within nine tenths of
// the rate the edge refused, after ProbeAfter past it. A block after a
// raise sets it back to the rate that ran clean and doubles the wait
// before the next raise past the ceiling; a block at a rate that had run
// clean halves it, and raises climb back at RaiseAfter each.
func TestPaceProbesUpward(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 20, 10*time.Millisecond)
	block(g, route) // 18 per second (56 ms), under a ceiling of 20
	probePassed(g, route)
	letOut(t, g, clk, 530) // 530 × 56 ms < 30 s: 19 per second is past nine tenths of 20
	if got := g.paceOf(route); got != 56*time.Millisecond {
		t.Fatalf("pace raised to %v before it ran clean for %v", got, ProbeAfter)
	}
	letOut(t, g, clk, 10)
	if got, want := g.paceOf(route), 54*time.Millisecond; got != want {
		t.Fatalf("pace after running clean for %v = %v; want %v (one more per second)", ProbeAfter, got, want)
	}
	// Blocked there: back to the rate that ran clean, and the next raise
	// past the ceiling waits twice as long.
	block(g, route)
	if got, want := g.paceOf(route), 56*time.Millisecond; got != want {
		t.Fatalf("pace after a block that followed a raise = %v; want %v, the rate that ran clean", got, want)
	}
	probePassed(g, route)
	letOut(t, g, clk, 1060) // 1,060 × 56 ms < 60 s
	if got := g.paceOf(route); got != 56*time.Millisecond {
		t.Fatalf("pace raised to %v before twice %v", got, ProbeAfter)
	}
	letOut(t, g, clk, 20)
	if got := g.paceOf(route); got != 54*time.Millisecond {
		t.Fatalf("pace after twice %v clean = %v; want 54ms", ProbeAfter, got)
	}
	// Blocked at 18.5 per second, then at the rate that ran clean for
	// RaiseAfter: halved, under a ceiling of 17.9 per second.
	block(g, route)
	probePassed(g, route)
	letOut(t, g, clk, 90) // 90 × 56 ms > 5 s
	block(g, route)
	if got, want := g.paceOf(route), 112*time.Millisecond; got != want {
		t.Fatalf("pace after a block at a rate that ran clean = %v; want %v", got, want)
	}
	probePassed(g, route)
	// Within nine tenths of the ceiling, raises come every RaiseAfter.
	letOut(t, g, clk, 44) // 44 × 112 ms < 5 s
	if got := g.paceOf(route); got != 112*time.Millisecond {
		t.Fatalf("pace raised to %v before it ran clean for %v", got, RaiseAfter)
	}
	letOut(t, g, clk, 2)
	if got, want := g.paceOf(route), 101*time.Millisecond; got != want {
		t.Fatalf("pace after running clean for %v under the ceiling = %v; want %v (one more per second)", RaiseAfter, got, want)
	}
}

// TestPaceNotHoldingDoesNotRise: a pace that never held a request back
// learns nothing about the edge, and stays.
func TestPaceNotHoldingDoesNotRise(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 20, 10*time.Millisecond)
	block(g, route)
	probePassed(g, route)
	ctx := context.Background()
	for range 20 {
		clk.Advance(time.Second)
		if err := g.awaitPace(ctx, store.Claim{Route: route}, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.paceOf(route); got != 56*time.Millisecond {
		t.Errorf("pace = %v after 20 s in which it held nothing back; want 56ms", got)
	}
}

// TestBlockOfEveryRoutePacesItsRoute: a block that holds every route (a
// body that is not JSON) paces the route that met it, whose requests the
// edge counted, not the whole store.
func TestBlockOfEveryRoutePacesItsRoute(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 8, 0)
	pass(g, clk, "GET /users/@me", 30, 10*time.Millisecond)
	g.Settle(&store.Reservation{}, &store.Claim{Route: route}, &store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked, Ban: true})
	if g.Estimate("GET /users/@me") == 0 {
		t.Error("the block does not hold another route")
	}
	if got, want := g.paceOf(route), 139*time.Millisecond; got != want {
		t.Errorf("pace of the route that met the block = %v; want %v (7.2 per second)", got, want)
	}
	if got := g.paceOf(All); got != 0 {
		t.Errorf("the whole store is paced (%v); want only the route that met the block", got)
	}
}

// TestBlockOfEveryRoutePacesTheRouteSentFirst: the responses of a block of
// every route may come back in any order; the pace falls on the route of
// the request granted first among them, which the edge met first, as long
// as nothing went out under the pace yet.
func TestBlockOfEveryRoutePacesTheRouteSentFirst(t *testing.T) {
	g, clk := newGates(t)
	const other = "POST /channels/:id/messages"
	pass(g, clk, route, 4, 0)
	pass(g, clk, other, 8, 10*time.Millisecond)
	ban := func(route string, granted time.Duration) {
		r := &store.Reservation{SendBy: clk.Now().Add(granted)}
		g.Settle(r, &store.Claim{Route: route}, &store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked, Ban: true})
	}
	ban(other, -20*time.Millisecond) // answered first, sent second
	if got := g.paceOf(other); got != 139*time.Millisecond {
		t.Fatalf("pace of the route that met the block first = %v; want 139ms", got)
	}
	ban(route, -60*time.Millisecond)
	if got := g.paceOf(other); got != 0 {
		t.Errorf("pace of the route sent second = %v; want none once a request sent before met the block", got)
	}
	if got, want := g.paceOf(route), 278*time.Millisecond; got != want {
		t.Errorf("pace of the route sent first = %v; want %v (3.6 per second)", got, want)
	}
	ban(other, -40*time.Millisecond) // sent after the first: changes nothing
	if got := g.paceOf(other); got != 0 {
		t.Errorf("pace of the route sent second = %v after another of its responses; want none", got)
	}
}

// TestBlockOfEveryRouteOnAnotherRouteUnpacesTheFirst: a block of every
// route whose pace fell on one route, followed by another that falls on
// another route, shows the first was the wrong one: its pace goes.
func TestBlockOfEveryRouteOnAnotherRouteUnpacesTheFirst(t *testing.T) {
	g, clk := newGates(t)
	const other = "POST /channels/:id/messages"
	ban := func(route string) {
		g.Settle(&store.Reservation{}, &store.Claim{Route: route}, &store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked, Ban: true})
	}
	pass(g, clk, route, 4, 0)
	pass(g, clk, other, 8, 10*time.Millisecond)
	ban(other)
	if g.paceOf(other) == 0 {
		t.Fatal("the first block of every route paced nothing")
	}
	clk.Advance(2 * time.Second)
	probePassed(g, All)
	if err := g.awaitPace(context.Background(), store.Claim{Route: other}, false, nil); err != nil {
		t.Fatal(err)
	}
	pass(g, clk, route, 4, 0)
	pass(g, clk, other, 8, 10*time.Millisecond)
	ban(route)
	if got := g.paceOf(other); got != 0 {
		t.Errorf("pace of the route the first block fell on = %v; want none once the next fell on another", got)
	}
	if g.paceOf(route) == 0 {
		t.Error("the route the second block fell on is not paced")
	}
}

// TestSecondNoteOfOneBlockLearnsNothing: the note of another process's
// block can come twice, first before the shared store held the block (no
// strike) and again once it did (one strike). The second is the same
// block: a pace that let requests out in between keeps its rate. A note of
// a probe blocked again (a second strike) lowers it.
func TestSecondNoteOfOneBlockLearnsNothing(t *testing.T) {
	g, clk := newGates(t)
	pass(g, clk, route, 5, 10*time.Millisecond) // 4.5 per second: 223 ms
	g.Merge([]State{{Key: route, Until: time.Second}}, clk.Now())
	g.mu.Lock()
	g.paces[route].tried = true // a request granted before went out under it
	g.mu.Unlock()
	g.Merge([]State{{Key: route, Until: time.Second, Strikes: 1}}, clk.Now())
	if got, want := g.paceOf(route), 223*time.Millisecond; got != want {
		t.Errorf("pace after the block's second note = %v; want %v, unchanged", got, want)
	}
	g.Merge([]State{{Key: route, Until: time.Second, Strikes: 2}}, clk.Now())
	if got, want := g.paceOf(route), 248*time.Millisecond; got != want {
		t.Errorf("pace after a blocked probe's note = %v; want %v (a tenth less)", got, want)
	}
}
