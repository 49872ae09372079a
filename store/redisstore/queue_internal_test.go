package redisstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// TestQueueUntil: a queue's waiters wait until the latest of their
// deadlines (a MaxWait counting from a waiter's start, a NoWait waiter not
// at all), or without a bound when one of them has none.
func TestQueueUntil(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name    string
		waiters []*waiter
		want    time.Time
	}{
		{"none", nil, time.Time{}},
		{"deadline", []*waiter{{start: t0, deadline: at(200)}}, at(200)},
		{"latest deadline", []*waiter{{start: t0, deadline: at(200)}, {start: at(50), deadline: at(900)}}, at(900)},
		{"max wait before deadline", []*waiter{{start: at(10), deadline: at(900), claim: store.Claim{MaxWait: 100 * time.Millisecond}}}, at(110)},
		{"max wait alone", []*waiter{{start: at(10), claim: store.Claim{MaxWait: time.Second}}}, at(1010)},
		{"no wait", []*waiter{{start: at(30), deadline: at(900), claim: store.Claim{NoWait: true}}}, at(30)},
		{"one without a bound", []*waiter{{start: t0, deadline: at(200)}, {start: t0}}, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &lqueue{waiters: tt.waiters}
			if got := q.until(t0); !got.Equal(tt.want) {
				t.Errorf("until = %v; want %v", got, tt.want)
			}
		})
	}
	// A queue whose callers keep asking (a waiter left without a slot in
	// the last keepAsking) holds its place as a waiter without a bound
	// would; one whose last miss is older, or that has no waiter, does not.
	short := func() []*waiter { return []*waiter{{start: at(1000), deadline: at(1200)}} }
	if got := (&lqueue{waiters: short(), missed: at(500)}).until(at(1000)); !got.IsZero() {
		t.Errorf("until, a waiter missed 500 ms ago = %v; want zero (no bound)", got)
	}
	if got := (&lqueue{waiters: short(), missed: at(-100)}).until(at(1000)); !got.Equal(at(1200)) {
		t.Errorf("until, the last miss 1.1 s ago = %v; want the deadline %v", got, at(1200))
	}
	if q := (&lqueue{missed: at(900)}); !q.asking(at(1000)) || !q.until(at(1000)).IsZero() {
		t.Errorf("a queue without waiters that missed 100 ms ago: asking %v; want true", q.asking(at(1000)))
	}
	if got := lifeOf(time.Time{}, t0); got != 0 {
		t.Errorf("lifeOf(zero) = %d; want 0 (no bound)", got)
	}
	if got := lifeOf(at(1500), at(1000)); got != 500 {
		t.Errorf("lifeOf(500 ms ahead) = %d; want 500", got)
	}
	if got := lifeOf(at(900), at(1000)); got != 1 {
		t.Errorf("lifeOf(past) = %d; want 1 (at least a millisecond)", got)
	}
	if got := lifeOf(at(1000).Add(time.Microsecond), at(1000)); got != 1 {
		t.Errorf("lifeOf(1 µs ahead) = %d; want 1 (rounded up)", got)
	}
}

// TestPushFailsWaitersDueBefore: a push that tells a line's turn comes
// later fails the queue's waiters whose deadlines (or MaxWait) come first,
// at once, and keeps the others; a push for a turn that comes now fails
// none.
func TestPushFailsWaitersDueBefore(t *testing.T) {
	s, ss := testSession(t)
	now := time.Now()
	newWaiter := func(c store.Claim, deadline time.Duration) *waiter {
		w := &waiter{claim: c, ready: make(chan struct{}), start: now}
		if deadline > 0 {
			w.deadline = now.Add(deadline)
		}
		return w
	}
	short := newWaiter(store.Claim{}, 100*time.Millisecond)
	brief := newWaiter(store.Claim{MaxWait: 200 * time.Millisecond}, 0)
	long := newWaiter(store.Claim{}, 5*time.Second)
	q := ss.queue(qkey{route: "POST /channels/:id/messages", major: "channels/1"})
	q.line = "L"
	for _, w := range []*waiter{short, brief, long} {
		q.add(w)
	}

	s.pushed(ss.tag, "L", 0, "")
	if len(q.waiters) != 3 {
		t.Fatalf("a push for a turn that comes now left %d waiters; want all 3", len(q.waiters))
	}
	s.pushed(ss.tag, "L", time.Second, "")
	for _, tc := range []struct {
		name string
		w    *waiter
		want error
	}{
		{"deadline in 100ms", short, context.DeadlineExceeded},
		{"MaxWait 200ms", brief, store.ErrWaitTooLong},
	} {
		if tc.w.state != failed {
			t.Errorf("%s: state %d after a push for a turn in 1s; want failed", tc.name, tc.w.state)
			continue
		}
		var werr *store.WaitError
		if !errors.As(tc.w.err, &werr) || !errors.Is(tc.w.err, tc.want) || werr.RetryAfter != time.Second || werr.Scope != store.ScopeUser {
			t.Errorf("%s: error %#v; want a user-scope wait error wrapping %v, retry after 1s", tc.name, tc.w.err, tc.want)
		}
	}
	if long.state != waiting || len(q.waiters) != 1 || q.waiters[0] != long {
		t.Errorf("the waiter with a deadline in 5s: state %d, queue %d; want it still waiting, alone", long.state, len(q.waiters))
	}
}

// TestPushKeepsTheTurnOfCallersThatKeepAsking: told its turn in a line,
// a queue without a waiter whose callers keep asking (one left without a
// slot a moment ago) keeps its place for the waiter it will have by then,
// or soon after, and gives it up once its callers stop asking; a queue
// whose callers stopped asking gives it up at once, telling the next.
func TestPushKeepsTheTurnOfCallersThatKeepAsking(t *testing.T) {
	for _, tc := range []struct {
		name   string
		missed time.Duration // how long ago a waiter missed (0: never)
		at     time.Duration // the push's turn
		keep   bool
	}{
		{"asking, turn later", 100 * time.Millisecond, time.Second, true},
		{"asking, turn now", 100 * time.Millisecond, 0, true},
		{"stopped asking, turn later", 3 * time.Second, time.Second, false},
		{"never missed, turn now", 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ss := testSession(t)
			q := ss.queue(qkey{route: "POST /channels/:id/messages", major: "channels/1"})
			q.line = "L"
			now := time.Now()
			if tc.missed > 0 {
				q.missed = now.Add(-tc.missed)
			}
			s.pushed(ss.tag, "L", tc.at, "")
			s.mu.Lock()
			defer s.mu.Unlock()
			if left := ss.leaves["L"]; left == tc.keep {
				t.Fatalf("gives its place up at once: %v; want %v", left, !tc.keep)
			}
			if !tc.keep {
				return
			}
			if at, idle := ss.nextWake(now); idle || !at.Equal(q.missed.Add(keepAsking)) {
				t.Errorf("next wake %v (idle %v); want when its callers stop counting as asking, %v", at, idle, q.missed.Add(keepAsking))
			}
			if p := s.plan(ss, now); slices.Contains(p.leaves, "L") {
				t.Errorf("a call while its callers ask gives the place up; want it kept")
			}
			// Its callers stop asking, no waiter came: the next call gives
			// the place up.
			if p := s.plan(ss, q.missed.Add(keepAsking)); !slices.Contains(p.leaves, "L") {
				t.Errorf("a call once its callers stopped asking leaves %v; want the line L left", p.leaves)
			}
		})
	}
}

// TestParsePush: a push names the credential's tag, the line and the turn
// in ms, and may name the route's bucket; anything else is dropped.
func TestParsePush(t *testing.T) {
	for _, tc := range []struct {
		in   string
		ok   bool
		at   time.Duration
		hash string
	}{
		{"t L 0", true, 0, ""},
		{"t L 250", true, 250 * time.Millisecond, ""},
		{"t L 0 abc123", true, 0, "abc123"},
		{"t L", false, 0, ""},
		{"t L 0 abc 1", false, 0, ""},
		{"t L 0 ", false, 0, ""},
		{"t L -1", false, 0, ""},
		{"t L x", false, 0, ""},
		{"t L 86400001", false, 0, ""},
		{" L 0", false, 0, ""},
		{"", false, 0, ""},
	} {
		tag, name, at, hash, ok := parsePush(tc.in)
		if ok != tc.ok || ok && (tag != "t" || name != "L" || at != tc.at || hash != tc.hash) {
			t.Errorf("parsePush(%q) = %q %q %v %q %v; want ok %v, turn %v, hash %q", tc.in, tag, name, at, hash, ok, tc.ok, tc.at, tc.hash)
		}
	}
}

// TestPushTellsTheBucket: a push that names the route's bucket sets the
// hash the queues of its line claim on next.
func TestPushTellsTheBucket(t *testing.T) {
	s, ss := testSession(t)
	q := ss.queue(qkey{route: "POST /channels/:id/messages", major: "channels/1"})
	q.line = "P"
	q.add(&waiter{ready: make(chan struct{}), start: time.Now()})
	s.pushed(ss.tag, "P", 0, "abc123")
	s.mu.Lock()
	defer s.mu.Unlock()
	if got := s.guess(ss.cred + "\x00" + q.key.route); got != "abc123" {
		t.Errorf("the route's hash after the push = %q; want abc123", got)
	}
}

// TestResyncBeforeKeepsWhatLaterCallsLearned: a subscription confirmed at
// a moment has the queues whose last call went before it ask again (a
// push meant for them may have been published before it), and keeps what
// the calls sent after it learned; a resync without a moment (Redis came
// back) has every queue ask again.
func TestResyncBeforeKeepsWhatLaterCallsLearned(t *testing.T) {
	s, ss := testSession(t)
	now := time.Now()
	confirmed := now.Add(-10 * time.Millisecond)
	early := ss.queue(qkey{route: "A", major: "channels/1"})
	late := ss.queue(qkey{route: "B", major: "channels/1"})
	for _, q := range []*lqueue{early, late} {
		q.notBefore, q.bound = now.Add(time.Second), now.Add(time.Second)
	}
	early.asked, late.asked = confirmed.Add(-time.Millisecond), confirmed.Add(time.Millisecond)
	ss.gate, ss.gateBound, ss.gateAsked = now.Add(time.Second), now.Add(time.Second), confirmed.Add(time.Millisecond)

	s.resyncBefore(confirmed)
	if !early.notBefore.IsZero() || !early.bound.IsZero() {
		t.Errorf("a queue asked before the subscription: wait %v, bound %v; want it asking again", early.notBefore, early.bound)
	}
	if late.notBefore.IsZero() || late.bound.IsZero() || ss.gate.IsZero() {
		t.Errorf("a queue asked after the subscription: wait %v, bound %v, gate %v; want what it learned kept", late.notBefore, late.bound, ss.gate)
	}
	s.resync()
	if !late.notBefore.IsZero() || !ss.gate.IsZero() {
		t.Errorf("after a full resync: wait %v, gate %v; want every queue asking again", late.notBefore, ss.gate)
	}
}

// TestFirstCallWaitsForTheSubscription: a Store's first call goes once its
// subscription is confirmed, so that no push its reply says to wait for is
// published before the Store listens.
func TestFirstCallWaitsForTheSubscription(t *testing.T) {
	s := New(stepClient(t), WithPrefix("ratecordtest:subwait:"+time.Now().Format(time.RFC3339Nano)))
	defer s.Close()
	p, err := s.Acquire(t.Context(), store.Claim{Credential: "bot", Route: "GET /users/@me", Major: "users/@me"})
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	select {
	case <-s.subscribed:
	default:
		t.Error("the first claim was answered before the subscription was confirmed")
	}
	p.Recycle()
}

// testSession returns a Store without a Redis client, closed when t ends,
// and a session of it for the credential "bot" (tag "t") whose driver
// counts as running, so that nothing calls Redis.
func testSession(t *testing.T) (*Store, *session) {
	s := New(nil)
	t.Cleanup(func() { s.Close() })
	ss := &session{cred: "bot", tag: "t", queues: make(map[qkey]*lqueue), wakeup: make(chan struct{}, 1),
		progress: make(chan struct{}), running: true}
	s.sessions[ss.cred], s.byTag[ss.tag] = ss, ss
	return s, ss
}
