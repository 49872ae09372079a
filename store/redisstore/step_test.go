package redisstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/model"
)

// stepClient returns a client of REDIS_ADDR (or 127.0.0.1:6379), skipping
// t without one, or failing it when CI is "true".
func stepClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redisAddrOrDefault()})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		msg := "no Redis for this test: set REDIS_ADDR to a server's address (" + err.Error() + ")"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return c
}

func redisAddrOrDefault() string {
	if a := os.Getenv("REDIS_ADDR"); a != "" {
		return a
	}
	return "127.0.0.1:6379"
}

// stepper drives the step function of a Store directly, call by call, as
// a driver would, for one credential.
type stepper struct {
	t     *testing.T
	s     *Store
	k     credKeys
	claim store.Claim
	no    uint64
	// glimit is the global limit the calls send (0: 50).
	glimit int
}

func newStepper(t *testing.T, name string) *stepper {
	c := stepClient(t)
	s := New(c, WithPrefix("ratecordtest:"+name+":"+time.Now().Format(time.RFC3339Nano)))
	t.Cleanup(func() { s.Close() })
	claim := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}
	return &stepper{t: t, s: s, k: s.keysOf(claim.Credential), claim: claim}
}

// call sends st, numbered no, and returns its reply, or the error of a
// reply Redis refused or did not give.
func (sp *stepper) call(st *step, no uint64) (stepReply, error) {
	sp.t.Helper()
	glimit := sp.glimit
	if glimit == 0 {
		glimit = 50
	}
	st.build(sp.s, sp.k, digest(sp.claim.Credential), no, glimit)
	v, err := st.run(sp.t.Context(), sp.s).Result()
	if err != nil {
		return stepReply{}, err
	}
	return parseStep(v, st.nReports, st.nClaims)
}

// next returns the number of a new call.
func (sp *stepper) next() uint64 {
	sp.no++
	return sp.no
}

// claimOnly claims n slots on the route, its hash guessed as guess, in a
// call of its own, and returns the claim's reply and its permit prefix.
func (sp *stepper) claimOnly(guess string, n int) (claimReply, string) {
	sp.t.Helper()
	no := sp.next()
	prefix := permitPrefix(sp.s.id, no, 1)
	var st step
	st.claim(sp.s, sp.k, &sp.claim, guess, n, 0, prefix, 0, 0)
	r, err := sp.call(&st, no)
	if err != nil {
		sp.t.Fatalf("claim: %v", err)
	}
	return r.claims[0], prefix
}

// report sends the report u of h, numbered seq, in a call of its own.
func (sp *stepper) report(h *permit, u store.Update, seq uint64) {
	sp.t.Helper()
	var st step
	st.report(sp.s, sp.k, h, &u, seq, 0)
	if _, err := sp.call(&st, sp.next()); err != nil {
		sp.t.Fatalf("report: %v", err)
	}
}

func (sp *stepper) permit(kind int, hash, member string) *permit {
	return &permit{cred: sp.claim.Credential, route: sp.claim.Route, major: sp.claim.Major, kind: kind, hash: hash, member: member}
}

// learn probes the route and reports a bucket of 2 per 10 s with one
// slot left.
func (sp *stepper) learn() { sp.learnAs(2, 1, 10*time.Second) }

// learnAs probes the route and reports the bucket "h" with limit slots,
// remaining of them left, resetting after reset.
func (sp *stepper) learnAs(limit, remaining int, reset time.Duration) {
	sp.t.Helper()
	r, prefix := sp.claimOnly("", 1)
	if r.kind != replyGrant || r.count != 1 || r.bkind != kindProbe {
		sp.t.Fatalf("first claim = %+v; want one probe slot", r)
	}
	sp.report(sp.permit(kindProbe, "", prefix+"1"), store.Update{Sent: true, Status: 200,
		Bucket: "h", HasLimit: true, Limit: limit, Remaining: remaining, ResetAfter: reset}, sp.next())
}

// TestStepAppliesReportsOnce sends the same report twice, as a driver does
// after a call that timed out but ran: the second is skipped, so a slot
// given back once is not given back twice.
func TestStepAppliesReportsOnce(t *testing.T) {
	sp := newStepper(t, "once")
	sp.learn()

	// The last slot of the window, never sent: its give-back is sent twice.
	r, prefix := sp.claimOnly("h", 1)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of the last slot = %+v; want one slot", r)
	}
	seq := sp.next()
	for range 2 {
		sp.report(sp.permit(kindLearned, "h", prefix+"1"), store.Update{}, seq)
	}
	// One slot came back, not two.
	if r, _ := sp.claimOnly("h", 2); r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of 2 after one slot was given back twice under one number = %+v; want 1 slot", r)
	}
}

// TestStepIgnoresLateCopy sends a call again after a later one ran, as a
// call whose reply was lost may reach Redis late: it changes nothing.
func TestStepIgnoresLateCopy(t *testing.T) {
	sp := newStepper(t, "late")
	sp.learn()
	late := sp.next()
	sp.next() // a later call runs first
	var st step
	st.claim(sp.s, sp.k, &sp.claim, "h", 1, 0, permitPrefix(sp.s.id, late, 1), 0, 0)
	if _, err := sp.call(&st, sp.no); err != nil {
		t.Fatal(err)
	}
	var again step
	again.claim(sp.s, sp.k, &sp.claim, "h", 1, 0, permitPrefix(sp.s.id, late, 1), 0, 0)
	if _, err := sp.call(&again, late); !errors.Is(err, errStale) {
		t.Fatalf("a late copy of a call = %v; want errStale", err)
	}
}

// TestStepUndoesLostCall undoes a call whose reply was lost: Redis gives
// back what it granted if it ran, and nothing if it did not.
func TestStepUndoesLostCall(t *testing.T) {
	sp := newStepper(t, "undo")
	sp.learn()

	// A claim that ran, its reply lost: its slot was the window's last.
	r, prefix := sp.claimOnly("h", 1)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of the last slot = %+v; want one slot", r)
	}
	ran := &lostCall{no: sp.no, claims: []lostClaim{{bid: learnedID("h", sp.claim.Major),
		pid: probeID(sp.claim.Route, sp.claim.Major), prefix: prefix, major: sp.claim.Major}}}
	// A lost call that never ran, undone first: nothing comes back.
	never := &lostCall{no: sp.no + 100, claims: ran.claims}
	var st step
	st.undoCall(sp.s, sp.k, never)
	st.claim(sp.s, sp.k, &sp.claim, "h", 1, 0, permitPrefix(sp.s.id, sp.no+101, 1), 0, 0)
	sp.no += 101
	rep, err := sp.call(&st, sp.no)
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.claims[0]; c.kind == replyGrant {
		t.Fatalf("claim after undoing a call that never ran = %+v; want a wait", c)
	}
	// Undoing the call that ran gives its slot back, if that call was the
	// last one applied: here the call that just refused came after it, so
	// nothing comes back either.
	var st2 step
	st2.undoCall(sp.s, sp.k, ran)
	st2.claim(sp.s, sp.k, &sp.claim, "h", 1, 0, permitPrefix(sp.s.id, sp.next(), 1), 0, 0)
	rep, err = sp.call(&st2, sp.no)
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.claims[0]; c.kind == replyGrant {
		t.Fatalf("claim after undoing a call a later one followed = %+v; want a wait", c)
	}

	// A granted claim whose reply was lost, undone by the very next call:
	// its slot comes back.
	sp2 := newStepper(t, "undo2")
	sp2.learn()
	r, prefix = sp2.claimOnly("h", 1)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of the last slot = %+v; want one slot", r)
	}
	lost := &lostCall{no: sp2.no, claims: []lostClaim{{bid: learnedID("h", sp2.claim.Major),
		pid: probeID(sp2.claim.Route, sp2.claim.Major), prefix: prefix, major: sp2.claim.Major}}}
	var st3 step
	st3.undoCall(sp2.s, sp2.k, lost)
	st3.claim(sp2.s, sp2.k, &sp2.claim, "h", 1, 0, permitPrefix(sp2.s.id, sp2.next(), 1), 0, 0)
	rep, err = sp2.call(&st3, sp2.no)
	if err != nil {
		t.Fatal(err)
	}
	if c := rep.claims[0]; c.kind != replyGrant || c.count != 1 {
		t.Fatalf("claim after undoing the lost call that ran = %+v; want the slot it had taken", c)
	}
}

// TestStepReservesNearSlotsOnly: a claim on a full global window is granted
// the slots that open within RESERVE_AHEAD of the call, each with its
// delay, and told to wait for those further off: a slot reserved long ahead
// would be lost to every process if its holder stopped running meanwhile.
func TestStepReservesNearSlotsOnly(t *testing.T) {
	c := stepClient(t)
	const window = 400 * time.Millisecond
	s := New(c, WithPrefix("ratecordtest:ahead:"+time.Now().Format(time.RFC3339Nano)),
		WithPolicy(store.Policy{GlobalWindow: window}))
	t.Cleanup(func() { s.Close() })
	claim := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true, GlobalLimit: 2}
	sp := &stepper{t: t, s: s, k: s.keysOf(claim.Credential), claim: claim, glimit: 2}
	answered := func(kind int, hash, member string) {
		p := sp.permit(kind, hash, member)
		p.global = true
		sp.report(p, store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true, Limit: 100, Remaining: 90,
			ResetAfter: 10 * time.Second}, sp.next())
	}
	// Two requests fill the global window; both answered, so the moments
	// their slots open again are exact.
	r, prefix := sp.claimOnly("", 1)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("first claim = %+v; want one slot", r)
	}
	before := time.Now()
	answered(kindProbe, "", prefix+"1")
	after := time.Now() // the first slot opens again a window after a moment in between
	if r, prefix = sp.claimOnly("h", 1); r.kind != replyGrant || r.count != 1 || len(r.delays) != 0 {
		t.Fatalf("second claim = %+v; want one slot, now", r)
	}
	answered(kindLearned, "h", prefix+"1")

	// The next slot is about a window away: no reservation, a wait.
	r, _ = sp.claimOnly("h", 1)
	if r.kind == replyGrant {
		t.Fatalf("claim on the full window, its next slot %v away = %+v; want a wait, no slot reserved", window, r)
	}
	if r.kind != replyWait || time.Duration(r.at)*time.Millisecond < window/2 {
		t.Fatalf("claim on the full window = %+v; want a wait of about %v", r, window)
	}

	// Shortly before it opens, the slot is reserved, with its delay.
	time.Sleep(time.Until(after.Add(window - 40*time.Millisecond)))
	claimed := time.Now()
	r, _ = sp.claimOnly("h", 1)
	if after.Sub(before) > 10*time.Millisecond || time.Since(before) >= window-5*time.Millisecond {
		t.Skip("the machine was too slow to place the claim just before the slot opened")
	}
	if r.kind != replyGrant || r.count != 1 || len(r.delays) != 1 || r.delays[0] < 1 || r.delays[0] > 50 {
		t.Fatalf("claim %v before the slot opens = %+v; want it reserved with a delay of at most 50 ms",
			before.Add(window).Sub(claimed), r)
	}
}

// TestStepWaitsBehindTicketsUntilTheyExpire: a process that waits behind
// another's ticket in a bucket's line is told to look again when that
// ticket expires if that comes before its own fallback (a window after
// its turn): a holder that stopped running would tell no one its turn is
// over.
func TestStepWaitsBehindTicketsUntilTheyExpire(t *testing.T) {
	a := newStepper(t, "behind")
	a.learn() // 2 per 10 s, one left
	if r, _ := a.claimOnly("h", 1); r.kind != replyGrant {
		t.Fatalf("claim of the last slot = %+v; want it", r)
	}
	// Process a waits for the next window: a ticket, expiring the ticket
	// grace after its turn.
	if r, _ := a.claimOnly("h", 1); r.kind != replyWait {
		t.Fatalf("claim on the spent bucket = %+v; want a wait", r)
	}
	s := New(stepClient(t), WithPrefix(a.s.prefix))
	t.Cleanup(func() { s.Close() })
	b := &stepper{t: t, s: s, k: s.keysOf(a.claim.Credential), claim: a.claim}
	r, _ := b.claimOnly("h", 1)
	if r.kind != replyWait {
		t.Fatalf("claim behind the ticket = %+v; want a wait", r)
	}
	// The window ends 10 s from now; a's ticket DefaultTicketGrace later.
	if at := time.Duration(r.at) * time.Millisecond; at > 10*time.Second+DefaultTicketGrace+100*time.Millisecond {
		t.Fatalf("told to look again in %v; want by the expiry of the ticket ahead, about %v", at, 10*time.Second+DefaultTicketGrace)
	}
}

// TestStepTellsOnlyHoldersAhead: a claim refused because holders ahead in
// the line keep the bucket's free slots tells those holders, not the ones
// behind it. Told, a holder behind would claim, be refused by the same
// holders and tell it again: two processes waiting behind one that stopped
// running kept each other calling Redis as fast as it answered.
func TestStepTellsOnlyHoldersAhead(t *testing.T) {
	x := newStepper(t, "ahead")
	x.learnAs(3, 2, 10*time.Second)
	other := func() *stepper {
		s := New(stepClient(t), WithPrefix(x.s.prefix))
		t.Cleanup(func() { s.Close() })
		return &stepper{t: t, s: s, k: s.keysOf(x.claim.Credential), claim: x.claim}
	}
	b, c := other(), other()

	// X takes the last two slots and waits for three more, then gives
	// both back: the free slots are X's to take, and X does not.
	r, prefix := x.claimOnly("h", 5)
	if r.kind != replyGrant || r.count != 2 {
		t.Fatalf("X's claim of 5 = %+v; want the last two slots", r)
	}
	x.report(x.permit(kindLearned, "h", prefix+"1"), store.Update{}, x.next())
	x.report(x.permit(kindLearned, "h", prefix+"2"), store.Update{}, x.next())

	sub := stepClient(t).Subscribe(t.Context(), c.s.channelPrefix()+c.s.id)
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(t.Context()); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	// A line keeps the order its holders took their places in, within one
	// millisecond too (TestStepLineKeepsTheOrderItTells).
	if r, _ := b.claimOnly("h", 1); r.kind != replyWait {
		t.Fatalf("B's claim behind X = %+v; want a wait", r)
	}
	if r, _ := c.claimOnly("h", 1); r.kind != replyWait {
		t.Fatalf("C's claim behind X and B = %+v; want a wait", r)
	}
	// B, told by C, claims again: it tells X, not C.
	if r, _ := b.claimOnly("h", 1); r.kind != replyWait {
		t.Fatalf("B's second claim = %+v; want a wait", r)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if m, err := sub.ReceiveMessage(ctx); err == nil {
		t.Fatalf("C was told %q after B's refused claim; want nothing: C stands behind B", m.Payload)
	}
}

// TestStepToldHolderThatDoesNotClaimLosesItsPlace: a holder told that its
// turn has come keeps its ticket only for the ticket grace, unless it
// claims: one that stopped running (SIGSTOP, a long pause) kept the slots
// its ticket stood for, here the two it gave back, from every other
// process until its turn in the next window (10 s here) and, told again at
// each turn, its even share of every window for as long as it slept.
func TestStepToldHolderThatDoesNotClaimLosesItsPlace(t *testing.T) {
	x := newStepper(t, "told")
	x.learnAs(3, 2, 10*time.Second)
	s := New(stepClient(t), WithPrefix(x.s.prefix))
	t.Cleanup(func() { s.Close() })
	b := &stepper{t: t, s: s, k: s.keysOf(x.claim.Credential), claim: x.claim}

	// X takes the last two slots and waits for three more, then gives
	// both back, and stops running: it claims no more.
	r, prefix := x.claimOnly("h", 5)
	if r.kind != replyGrant || r.count != 2 {
		t.Fatalf("X's claim of 5 = %+v; want the last two slots", r)
	}
	x.report(x.permit(kindLearned, "h", prefix+"1"), store.Update{}, x.next())
	x.report(x.permit(kindLearned, "h", prefix+"2"), store.Update{}, x.next())

	// B's claim finds the free slots kept by X's ticket, and tells X.
	if w, _ := b.claimOnly("h", 1); w.kind != replyWait {
		t.Fatalf("B's claim behind X, which keeps the free slots = %+v; want a wait", w)
	}
	time.Sleep(DefaultTicketGrace + 20*time.Millisecond)
	if r, _ := b.claimOnly("h", 1); r.kind != replyGrant {
		t.Fatalf("B's claim once X, told, had the ticket grace (%v) to claim = %+v; want a slot: X's ticket ended", DefaultTicketGrace, r)
	}
}

// TestStepLineKeepsTheOrderItTells: two processes that take their places
// in a bucket's line in the same millisecond stand in the order they were
// told. Ordered by the millisecond alone, and then by process id, the one
// told it was first could find itself second when its turn came: it was
// told to wait a window more, and so was the other, behind it, and the
// bucket's next window went unused (headers that overstate a limit, at 4
// processes: one window in three lost in 4 of 20 runs).
func TestStepLineKeepsTheOrderItTells(t *testing.T) {
	a := newStepper(t, "order")
	now := time.Now()
	clock := func() time.Time { return now }
	a.s.clock = clock
	a.learn() // 2 per 10 s, one left
	if r, _ := a.claimOnly("h", 1); r.kind != replyGrant {
		t.Fatalf("claim of the last slot = %+v; want it", r)
	}
	other := func() *stepper {
		s := New(stepClient(t), WithPrefix(a.s.prefix))
		s.clock = clock
		t.Cleanup(func() { s.Close() })
		return &stepper{t: t, s: s, k: s.keysOf(a.claim.Credential), claim: a.claim}
	}
	first, second := other(), other()
	// The process whose id sorts last joins first.
	if first.s.id < second.s.id {
		first, second = second, first
	}
	r1, _ := first.claimOnly("h", 1)
	r2, _ := second.claimOnly("h", 1)
	if r1.kind != replyWait || r2.kind != replyWait {
		t.Fatalf("claims on the spent bucket = %+v, %+v; want waits", r1, r2)
	}
	if r1.at >= r2.at {
		t.Fatalf("the first in line was told %d ms, the second %d ms; want the first sooner", r1.at, r2.at)
	}
	// Both ask again, in the same millisecond: each keeps what it was told.
	if r, _ := first.claimOnly("h", 1); r.kind != replyWait || r.at != r1.at {
		t.Fatalf("the first in line, asking again, = %+v; want a wait of %d ms, as told", r, r1.at)
	}
	if r, _ := second.claimOnly("h", 1); r.kind != replyWait || r.at != r2.at {
		t.Fatalf("the second in line, asking again, = %+v; want a wait of %d ms, as told", r, r2.at)
	}
}

// TestStepTicketLivesAsLongAsItsWaiters: a claim whose waiters wait less
// than the known wait (fail-fast callers) takes no place in the bucket's
// line, so that no process is later told its turn for waiters long gone
// (and gives it up, telling the next, one call per process); a claim whose
// waiters outlast the wait holds its ticket no longer than they wait; a
// claim without a bound holds it until its turn plus the ticket grace.
func TestStepTicketLivesAsLongAsItsWaiters(t *testing.T) {
	a := newStepper(t, "life")
	a.learn() // 2 per 10 s, one left
	if r, _ := a.claimOnly("h", 1); r.kind != replyGrant {
		t.Fatalf("claim of the last slot = %+v; want it", r)
	}
	s := New(stepClient(t), WithPrefix(a.s.prefix))
	t.Cleanup(func() { s.Close() })
	b := &stepper{t: t, s: s, k: s.keysOf(a.claim.Credential), claim: a.claim}
	bid := guessedID("h", b.claim.Route, b.claim.Major)
	claim := func(life int64) claimReply {
		t.Helper()
		no := b.next()
		var st step
		st.claim(b.s, b.k, &b.claim, "h", 1, 0, permitPrefix(b.s.id, no, 1), life, 0)
		r, err := b.call(&st, no)
		if err != nil {
			t.Fatalf("claim: %v", err)
		}
		if c := r.claims[0]; c.kind != replyWait || c.bound < 9000 {
			t.Fatalf("claim on the bucket spent for 10 s = %+v; want a wait known to last about 10 s", c)
		}
		return r.claims[0]
	}
	// ticket returns b's ticket in the bucket's line: its expiry in ms
	// from now, and whether there is one.
	ticket := func() (time.Duration, bool) {
		t.Helper()
		c := stepClient(t)
		if _, err := c.ZScore(t.Context(), b.k.line(bid), b.s.id).Result(); errors.Is(err, redis.Nil) {
			return 0, false
		} else if err != nil {
			t.Fatalf("line: %v", err)
		}
		v, err := c.HGet(t.Context(), b.k.tix(bid), b.s.id).Result()
		if err != nil {
			t.Fatalf("ticket: %v", err)
		}
		var want, expiry, lane int64
		if _, err := fmt.Sscanf(strings.ReplaceAll(v, "|", " "), "%d %d %d", &want, &expiry, &lane); err != nil {
			t.Fatalf("ticket %q: %v", v, err)
		}
		tm, err := c.Time(t.Context()).Result()
		if err != nil {
			t.Fatalf("time: %v", err)
		}
		return time.Duration(expiry-tm.UnixMilli()) * time.Millisecond, true
	}

	r := claim(500) // waiters gone in 0.5 s, their turn about 10 s away
	if _, ok := ticket(); ok {
		t.Fatal("a claim whose waiters wait 500 ms took a place in a line whose turn is 10 s away")
	}
	// Waiters gone 100 ms after their turn, before the ticket grace
	// (250 ms) would end: worth a place, until they are gone.
	life := r.bound + 100
	claim(life)
	if exp, ok := ticket(); !ok || exp > time.Duration(life)*time.Millisecond || exp < time.Duration(life-200)*time.Millisecond {
		t.Fatalf("ticket of waiters gone in %d ms: expires in %v (held %v); want about %d ms", life, exp, ok, life)
	}
	claim(0) // no bound: until the turn plus the grace
	if exp, ok := ticket(); !ok || exp < 10*time.Second+DefaultTicketGrace-time.Second {
		t.Fatalf("ticket of waiters without a bound: expires in %v (held %v); want 10 s + %v", exp, ok, DefaultTicketGrace)
	}
}

// TestStepHoldsOnlyTheLineItWaitsIn: a process whose claim waits for the
// global window while the bucket has room for it gives up its place in the
// bucket's line, and one whose claim waits for the bucket gives up its
// place in the global window's line, each only where no other queue of the
// process needs that place (the claim's sole flags). A place kept in the
// other line kept slots the process could not use from the holders behind,
// who, told of them, met the line this process waited in: the two lines
// told each other's holders in turn, many calls per request.
func TestStepHoldsOnlyTheLineItWaitsIn(t *testing.T) {
	c := stepClient(t)
	prefix := "ratecordtest:sole:" + time.Now().Format(time.RFC3339Nano)
	pol := store.Policy{GlobalWindow: 10 * time.Second}
	claim := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true, GlobalLimit: 2}
	process := func(route string) *stepper {
		s := New(c, WithPrefix(prefix), WithPolicy(pol))
		t.Cleanup(func() { s.Close() })
		cl := claim
		cl.Route = route
		return &stepper{t: t, s: s, k: s.keysOf(cl.Credential), claim: cl, glimit: 2}
	}
	a, b := process(claim.Route), process(claim.Route)
	// onOther runs f with A's claims on another route of the same bucket.
	onOther := func(f func()) {
		a.claim.Route = "GET /channels/:id/messages"
		f()
		a.claim.Route = claim.Route
	}
	global := func(sp *stepper, kind int, hash, member string) *permit {
		p := sp.permit(kind, hash, member)
		p.global = true
		return p
	}
	claimSole := func(sole int) claimReply {
		t.Helper()
		no := b.next()
		var st step
		st.claim(b.s, b.k, &b.claim, "h", 1, 0, permitPrefix(b.s.id, no, 1), 0, sole)
		r, err := b.call(&st, no)
		if err != nil {
			t.Fatalf("B's claim: %v", err)
		}
		return r.claims[0]
	}
	bid := guessedID("h", claim.Route, claim.Major)
	holds := func(line string) bool {
		t.Helper()
		_, err := c.ZScore(t.Context(), b.k.line(line), b.s.id).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("line %s: %v", line, err)
		}
		return err == nil
	}
	// waits has B claim with sole, wants a wait of scope, and wants B to
	// hold a place in the bucket's line and in the window's as told.
	waits := func(what string, sole, scope int, inBucket, inGlobal bool) {
		t.Helper()
		if r := claimSole(sole); r.kind != replyWait || r.scope != scope {
			t.Fatalf("%s: B's claim = %+v; want a wait of scope %d", what, r, scope)
		}
		if b, g := holds(bid), holds(globalLine); b != inBucket || g != inGlobal {
			t.Fatalf("%s: places in the bucket's line %v, the window's %v; want %v, %v", what, b, g, inBucket, inGlobal)
		}
	}

	// A learns the bucket (2 per 10 s) and takes its last slot: the
	// bucket is spent and the global window (2) full.
	r, pa := a.claimOnly("", 1)
	if r.kind != replyGrant {
		t.Fatalf("A's first claim = %+v; want a probe slot", r)
	}
	a.report(global(a, kindProbe, "", pa+"1"), store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true,
		Limit: 2, Remaining: 1, ResetAfter: 10 * time.Second}, a.next())
	r, pa = a.claimOnly("h", 1)
	if r.kind != replyGrant {
		t.Fatalf("A's claim of the last slot = %+v; want it", r)
	}
	// B waits for the bucket: a place in its line.
	if r := claimSole(soleGlobal | soleBucket); r.kind != replyWait || r.scope != waitUser {
		t.Fatalf("B's claim on the spent bucket = %+v; want a wait for the bucket", r)
	}
	if !holds(bid) {
		t.Fatal("B, waiting for the bucket, holds no place in its line")
	}

	// A gives its slot back (the bucket has room for B) and takes the
	// global slot with a probe of another route: B now waits for the
	// global window alone.
	a.report(global(a, kindLearned, "h", pa+"1"), store.Update{}, a.next())
	var pa2 string
	onOther(func() { r, pa2 = a.claimOnly("", 1) })
	if r.kind != replyGrant {
		t.Fatalf("A's probe of another route = %+v; want a slot", r)
	}
	waits("the bucket's room, the global window full, another queue of B in the bucket's line", soleGlobal, waitGlobal, true, true)
	waits("the bucket's room, the global window full, B waiting for the window alone", soleGlobal|soleBucket, waitGlobal, false, true)

	// A's probe answers for the same bucket, spent: B waits for the
	// bucket again, and gives up its place in the window's line only
	// where no other queue of it needs it.
	onOther(func() {
		a.report(global(a, kindProbe, "", pa2+"1"), store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true,
			Limit: 2, Remaining: 0, ResetAfter: 10 * time.Second}, a.next())
	})
	waits("the bucket spent again, another queue of B in the window's line", soleBucket, waitUser, true, true)
	waits("the bucket spent again, B waiting for the bucket alone", soleGlobal|soleBucket, waitUser, true, false)
}

// TestStepReportTellsTheNextHolderTheReopening: the grant of a window's
// first request tells the next holder in line its turn at the reset it
// estimates (the window opens when the request reaches Discord); the
// response tells the reset, later: the report tells the first holder, so
// that it claims once, at the reset, not at the estimate to be told the
// rest.
func TestStepReportTellsTheNextHolderTheReopening(t *testing.T) {
	x := newStepper(t, "reopen")
	x.learnAs(1, 0, 300*time.Millisecond)
	b, next := pushedOther(t, x)
	time.Sleep(350 * time.Millisecond) // the window is over

	r, prefix := x.claimOnly("h", 1)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("X's claim in a new window = %+v; want its slot", r)
	}
	// B, a waiter without a bound, takes a place in line: its turn is the
	// estimated reset, about a window away.
	est, _ := b.claimOnly("h", 1)
	if est.kind != replyWait || est.bound < 200 || est.bound > 400 {
		t.Fatalf("B's claim = %+v; want a wait bound by the estimated reset, about 300 ms", est)
	}
	// X's response: the window resets 2 s from now.
	x.report(x.permit(kindLearned, "h", prefix+"1"), store.Update{Sent: true, Status: 200,
		Bucket: "h", HasLimit: true, Limit: 1, Remaining: 0, ResetAfter: 2 * time.Second}, x.next())
	tag, name, at, hash, payload := next()
	if hash != "" || tag != digest(x.claim.Credential) || name != est.line || at < 1900*time.Millisecond || at > 2100*time.Millisecond {
		t.Fatalf("B was told %q; want its turn in line %q in about 2 s", payload, est.line)
	}
}

// TestStepProbeAnswerTellsTheBucket: the processes that waited for a
// route's probe are told, with their turn, the bucket the probe's response
// mapped the route to, so that they claim on it at once rather than be told
// so by a reply of their own.
func TestStepProbeAnswerTellsTheBucket(t *testing.T) {
	x := newStepper(t, "probehash")
	r, prefix := x.claimOnly("", 1)
	if r.kind != replyGrant || r.bkind != kindProbe {
		t.Fatalf("first claim = %+v; want one probe slot", r)
	}
	b, next := pushedOther(t, x)
	w, _ := b.claimOnly("", 1)
	if w.kind != replyWait || !w.push {
		t.Fatalf("B's claim while the probe is out = %+v; want a wait for a push", w)
	}
	x.report(x.permit(kindProbe, "", prefix+"1"), store.Update{Sent: true, Status: 200,
		Bucket: "abc123", HasLimit: true, Limit: 5, Remaining: 4, ResetAfter: 5 * time.Second}, x.next())
	tag, name, at, hash, payload := next()
	if tag != digest(x.claim.Credential) || name != w.line || at != 0 || hash != "abc123" {
		t.Fatalf("B was told %q; want its turn in line %q now, with the bucket abc123", payload, w.line)
	}
	// Told the bucket, B's claim on it is served: no reply of its own
	// needs to tell it.
	if r, _ := b.claimOnly(hash, 1); r.kind != replyGrant || r.bkind != kindLearned {
		t.Fatalf("B's claim on the bucket it was told = %+v; want a slot of it", r)
	}
}

// TestStepOverdueProbeLetsTheNextGo: a probe whose answer is overdue (its
// process stopped or died after the grant) no longer holds the route's next
// request back. Another process's claim meanwhile waits for a push, but
// no longer than until the probe is overdue, and a claim then is granted
// the next probe.
func TestStepOverdueProbeLetsTheNextGo(t *testing.T) {
	x := newStepper(t, "overdue")
	if r, _ := x.claimOnly("", 1); r.kind != replyGrant || r.bkind != kindProbe {
		t.Fatalf("first claim = %+v; want one probe slot", r)
	}
	b, _ := pushedOther(t, x)
	w, _ := b.claimOnly("", 1)
	overdue := (store.DefaultGlobalHold + model.ReportSlack*time.Millisecond).Milliseconds()
	if w.kind != replyWait || !w.push || w.bound != 0 || w.at <= 0 || w.at > overdue {
		t.Fatalf("B's claim while the probe is out = %+v; want a wait for a push, asking again within %d ms at most, of no known length", w, overdue)
	}
	time.Sleep(time.Duration(w.at)*time.Millisecond + 20*time.Millisecond)
	if r, _ := b.claimOnly("", 1); r.kind != replyGrant || r.bkind != kindProbe {
		t.Fatalf("B's claim once the probe is overdue = %+v; want the next probe", r)
	}
}

// TestStepOverdueProbeOfAStoppedProcess: the process whose probe is
// overdue also holds the first ticket of the probe's line for its other
// waiters, and stops running, so it neither claims nor tells anyone. Once
// the probe is overdue, another process waits only until that ticket ends,
// not for a push that will not come, and is then granted the next probe.
func TestStepOverdueProbeOfAStoppedProcess(t *testing.T) {
	x := newStepper(t, "overdue-stopped")
	if r, _ := x.claimOnly("", 2); r.kind != replyGrant || r.count != 1 || r.bkind != kindProbe {
		t.Fatalf("first claim = %+v; want one probe slot of two", r)
	}
	if w, _ := x.claimOnly("", 1); w.kind != replyWait {
		t.Fatalf("its other waiter's claim = %+v; want a wait, with a ticket in line", w)
	}
	b, _ := pushedOther(t, x)
	overdue := store.DefaultGlobalHold + model.ReportSlack*time.Millisecond
	time.Sleep(overdue + 20*time.Millisecond)
	w, _ := b.claimOnly("", 1)
	// The ticket ahead ends DefaultTicketGrace after the stopped
	// process's own wait, which ended when the probe became overdue.
	if w.kind != replyWait || w.at <= 0 || w.at > DefaultTicketGrace.Milliseconds()+20 {
		t.Fatalf("B's claim behind the stopped process's ticket = %+v; want a wait until that ticket ends, within %v", w, DefaultTicketGrace)
	}
	time.Sleep(time.Duration(w.at)*time.Millisecond + 20*time.Millisecond)
	if r, _ := b.claimOnly("", 1); r.kind != replyGrant || r.bkind != kindProbe {
		t.Fatalf("B's claim once the ticket ended = %+v; want the next probe", r)
	}
}

// pushedOther returns another process of x's credential, subscribed to its
// own channel, and a function that returns the next push it is told,
// failing t when none comes within a second.
func pushedOther(t *testing.T, x *stepper) (*stepper, func() (tag, name string, at time.Duration, hash string, payload string)) {
	t.Helper()
	s := New(stepClient(t), WithPrefix(x.s.prefix))
	t.Cleanup(func() { s.Close() })
	b := &stepper{t: t, s: s, k: s.keysOf(x.claim.Credential), claim: x.claim}
	sub := stepClient(t).Subscribe(t.Context(), b.s.channelPrefix()+b.s.id)
	t.Cleanup(func() { sub.Close() })
	if _, err := sub.Receive(t.Context()); err != nil {
		t.Fatalf("subscribe: %v", err)
	}
	return b, func() (string, string, time.Duration, string, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		m, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatalf("the other process was told nothing: %v", err)
		}
		tag, name, at, hash, ok := parsePush(m.Payload)
		if !ok {
			t.Fatalf("the other process was told %q, not a push", m.Payload)
		}
		return tag, name, at, hash, m.Payload
	}
}
