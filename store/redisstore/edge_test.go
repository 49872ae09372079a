package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// TestBlockAcrossProcesses: a Cloudflare block one process meets holds the
// route in another process sharing the store, and only one probe goes out
// across both; its passing releases both.
func TestBlockAcrossProcesses(t *testing.T) {
	addr := redisAddr(t)
	client := newClient(t, addr)
	prefix := testPrefix(t)
	pol := store.Policy{BlockPause: time.Second}
	a := redisstore.New(client, redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	b := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	route := "POST /channels/:id/messages"
	ca := store.Claim{Credential: "edge-a", Route: route, Major: "channels/1"}
	cb := store.Claim{Credential: "edge-b", Route: route, Major: "channels/2"}

	// b follows the store's channel from its first Acquire on.
	r, err := b.Acquire(ctx, cb)
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel()
	r, err = a.Acquire(ctx, ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Report(ctx, store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked}); err != nil {
		t.Fatal(err)
	}

	// Within a moment, b holds the route too.
	awaitBlocked(t, route, "process b never learned of the block process a met", b)
	nowait := cb
	nowait.NoWait = true
	if _, err := b.Acquire(ctx, nowait); !errors.Is(err, store.ErrWaitTooLong) {
		t.Fatalf("process b during the block: Acquire = %v; want ErrWaitTooLong", err)
	}

	// After the pause, one probe across both processes.
	type res struct {
		r   *store.Reservation
		err error
	}
	got := make(chan res, 2)
	for _, s := range []*redisstore.Store{a, b} {
		c := ca
		if s == b {
			c = cb
		}
		go func() {
			r, err := s.Acquire(ctx, c)
			got <- res{r, err}
		}()
	}
	var probe res
	select {
	case probe = <-got:
		if probe.err != nil {
			t.Fatal(probe.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no probe after the pause")
	}
	select {
	case r := <-got:
		t.Fatalf("a second request went while the probe was out (err %v)", r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := probe.r.Report(ctx, store.Update{Sent: true, Status: 200}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		r.r.Cancel()
	case <-time.After(3 * time.Second):
		t.Fatal("the other process stayed blocked after the probe passed")
	}
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if r, err := a.Acquire(wctx, ca); err != nil {
		t.Fatalf("after the block: %v", err)
	} else {
		r.Cancel()
	}
}

// TestKindOneAtATimeAcrossProcesses: the claims of a Kind go one at a time
// across processes sharing the store: a rename of a channel one process
// has out holds the renames of that channel in another, until its response
// is reported.
func TestKindOneAtATimeAcrossProcesses(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	a := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix))
	b := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix))
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	rename := store.Claim{Credential: "kind-bot", Route: "PATCH /channels/:id", Major: "channels/7", Kind: "rename"}
	ok := func(remaining int) store.Update {
		return store.Update{Sent: true, Status: 200, Bucket: "chan", HasLimit: true, Limit: 10, Remaining: remaining, ResetAfter: 30 * time.Second}
	}

	r, err := a.Acquire(ctx, rename)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	var rb *store.Reservation
	go func() {
		var err error
		rb, err = b.Acquire(ctx, rename)
		got <- err
	}()
	select {
	case err := <-got:
		t.Fatalf("process b: a rename was granted (err %v) while process a had one of the channel out", err)
	case <-time.After(300 * time.Millisecond):
	}
	if err := r.Report(ctx, ok(9)); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("process b after a's response: Acquire = %v; want a permit", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("process b: the rename still waits 5 s after process a's response")
	}
	if err := rb.Report(ctx, ok(8)); err != nil {
		t.Fatal(err)
	}
}

// passed is a response that passed the edge, for the pace tests.
var passed = store.Update{Sent: true, Status: 200, Bucket: "m", HasLimit: true, Limit: 100, Remaining: 90, ResetAfter: 30 * time.Second}

// sender returns a function that claims c on s, reports u for it and
// returns when the claim was granted.
func sender(t *testing.T) func(s *redisstore.Store, c store.Claim, u store.Update) time.Time {
	return func(s *redisstore.Store, c store.Claim, u store.Update) time.Time {
		t.Helper()
		r, err := s.Acquire(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		at := time.Now()
		if err := r.Report(t.Context(), u); err != nil {
			t.Fatal(err)
		}
		return at
	}
}

// A process that sent six requests in the second before a block goes at
// nine tenths of that after it: 5.4 per second, one every pacedEvery
// (less paceSlack for the timers).
const pacedEvery, paceSlack = 186 * time.Millisecond, 20 * time.Millisecond

// awaitBlocked waits until each of ss holds route back (it learned of a
// block) and fails t, saying what did not happen, after two seconds.
func awaitBlocked(t *testing.T, route, what string, ss ...*redisstore.Store) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second)
	for _, s := range ss {
		for s.BlockedFor(route) == 0 {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// checkPaced sends c through s n+1 times and fails t when one of the last
// n left sooner than the pace after the one before; what names them.
func checkPaced(t *testing.T, s *redisstore.Store, c store.Claim, n int, what string) {
	t.Helper()
	send := sender(t)
	last := send(s, c, passed)
	for i := range n {
		at := send(s, c, passed)
		if gap := at.Sub(last); gap < pacedEvery-paceSlack {
			t.Errorf("%s, request %d: %v after the one before; want at least %v", what, i+2, gap, pacedEvery)
		}
		last = at
	}
}

// checkNotPaced sends c through s n times and fails t when one waited as
// a pace would have it; what names them.
func checkNotPaced(t *testing.T, s *redisstore.Store, c store.Claim, n int, what string) {
	t.Helper()
	for i := range n {
		r, err := s.Acquire(t.Context(), c)
		if err != nil {
			t.Fatal(err)
		}
		if r.Waited > pacedEvery/2 {
			t.Errorf("%s, request %d: waited %v; want no pace", what, i+1, r.Waited)
		}
		if err := r.Report(t.Context(), passed); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBlockPacesEveryProcess: a block one process meets paces, in each
// process sharing the store, what that process sent: a process that sent
// six requests in the second before goes at nine tenths of that (5.4 per
// second) after it, one that sent none is not paced.
func TestBlockPacesEveryProcess(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	pol := store.Policy{BlockPause: time.Second}
	var s [3]*redisstore.Store
	for i := range s {
		s[i] = redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
		defer s[i].Close()
	}
	a, b, idle := s[0], s[1], s[2]
	ctx := t.Context()
	route := "GET /channels/:id/messages"
	claim := func(cred string) store.Claim {
		return store.Claim{Credential: cred, Route: route, Major: "channels/1"}
	}
	ok, send := passed, sender(t)

	r, err := idle.Acquire(ctx, claim("pace-c")) // idle follows the store's channel
	if err != nil {
		t.Fatal(err)
	}
	r.Cancel()
	for range 6 {
		send(b, claim("pace-b"), ok)
	}
	send(a, claim("pace-a"), store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked})
	awaitBlocked(t, route, "the other processes never learned of the block", b, idle)
	send(a, claim("pace-a"), ok) // the probe, after the pause
	checkPaced(t, b, claim("pace-b"), 3, "process b after the block")
	checkNotPaced(t, idle, claim("pace-c"), 3, "the process that sent nothing, after the block")
}

// TestBlockOfEveryRoutePacesItsRouteInEveryProcess: a block of every
// route (a body that is not JSON) that one process meets on a route paces
// that route in another process sharing the store, not every route: the
// note of the block names it.
func TestBlockOfEveryRoutePacesItsRouteInEveryProcess(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	pol := store.Policy{BlockPause: time.Second}
	a := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	b := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	defer a.Close()
	defer b.Close()
	const route, other = "GET /channels/:id/messages", "POST /channels/:id/messages"
	claim := func(cred, route string) store.Claim {
		return store.Claim{Credential: cred, Route: route, Major: "channels/1"}
	}
	ok, send := passed, sender(t)
	for range 6 {
		send(b, claim("ban-b", route), ok)
		send(b, claim("ban-b", other), ok)
	}
	send(a, claim("ban-a", route), store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked, Ban: true})
	awaitBlocked(t, other, "the other process never learned of the block", b)
	send(a, claim("ban-a", route), ok) // the probe, after the pause
	// Six passed in b on each route: the route that met the block goes at
	// 5.4 per second, the other route at once.
	checkPaced(t, b, claim("ban-b", route), 2, "process b, the route that met the block")
	checkNotPaced(t, b, claim("ban-b", other), 3, "process b, another route")
}

// TestBlockOfEveryRouteReadFromRedisPacesItsRoute: a process that learns
// of a block of every route by reading the shared gates, not from the
// note of the block (it subscribed, or subscribed again, after the note
// went out), paces the route that met the block, as a process told by
// the note does: the gate in Redis names it.
func TestBlockOfEveryRouteReadFromRedisPacesItsRoute(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	pol := store.Policy{BlockPause: 300 * time.Millisecond}
	a := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	b := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	const route, other = "GET /channels/:id/messages", "POST /channels/:id/messages"
	claim := func(cred, route string) store.Claim {
		return store.Claim{Credential: cred, Route: route, Major: "channels/1"}
	}
	send := sender(t)
	send(a, claim("ban-a", route), store.Update{Sent: true, Status: 429, Scope: store.ScopeBlocked, Ban: true})
	var routes map[string]string
	var err error
	for deadline := time.Now().Add(2 * time.Second); len(routes) == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // the block is written in the background
		if routes, err = a.GateRoutes(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if routes["*"] != route {
		t.Fatalf("gates in Redis after a block of every route met on %q = %v; want the gate of every route to name it", route, routes)
	}

	// A gate written before the route was kept reads as naming none.
	client := newClient(t, addr)
	if err := client.HSet(ctx, b.EdgeKey(), "*", "99999999999999|0|1|").Err(); err != nil {
		t.Fatal(err)
	}
	if routes, err = b.GateRoutes(ctx); err != nil || routes["*"] != "" {
		t.Fatalf("gates in Redis holding an older gate = %v, %v; want it read, naming no route", routes, err)
	}
	if err := client.Del(ctx, b.EdgeKey()).Err(); err != nil {
		t.Fatal(err)
	}

	// Process b has sent six on each route, then reads a block of every
	// route met on route, with no note of it.
	for range 6 {
		send(b, claim("ban-b", route), passed)
		send(b, claim("ban-b", other), passed)
	}
	tm, err := client.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	until := tm.Add(300 * time.Millisecond).UnixMilli()
	if err := client.HSet(ctx, b.EdgeKey(), "*", fmt.Sprintf("%d|0|1||%s", until, route)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := client.Publish(ctx, b.EdgeChannel(), "1").Err(); err != nil { // read the gates
		t.Fatal(err)
	}
	awaitBlocked(t, other, "process b never read the block", b)
	send(b, claim("ban-b", route), passed) // the probe, after the pause
	checkPaced(t, b, claim("ban-b", route), 1, "process b, the route that met the block")
	checkNotPaced(t, b, claim("ban-b", other), 3, "process b, another route")
}

// TestSharedResourceAcrossProcesses: a 429 of scope shared that one
// process meets holds that resource, and only it, in another process
// sharing the store, for the wait the 429 names.
func TestSharedResourceAcrossProcesses(t *testing.T) {
	addr := redisAddr(t)
	prefix := testPrefix(t)
	pol := store.Policy{ResetOffset: -1}
	a := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	b := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithPolicy(pol))
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	route := "PUT /channels/:id/messages/:id/reactions/:reaction/@me"
	claim := func(msg string) store.Claim {
		return store.Claim{Credential: "shared-cred", Route: route, Major: "channels/1",
			Path: "/api/v10/channels/1/messages/" + msg + "/reactions/%F0%9F%91%8D/@me"}
	}
	// b follows the store's channel from its first Acquire on, and its
	// response teaches the bucket: 50 per 10 s.
	r, err := b.Acquire(ctx, claim("3"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Report(ctx, store.Update{Sent: true, Status: 204, Bucket: "react", HasLimit: true, Limit: 50, Remaining: 49, ResetAfter: 10 * time.Second}); err != nil {
		t.Fatal(err)
	}
	r, err = a.Acquire(ctx, claim("1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Report(ctx, store.Update{Sent: true, Status: 429, Scope: store.ScopeShared, RetryAfter: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	held := claim("1")
	held.NoWait = true
	deadline := time.Now().Add(2 * time.Second)
	for {
		r, err := b.Acquire(ctx, held)
		if err == nil {
			r.Cancel() // before the note came: allowed
		}
		var we *store.WaitError
		if errors.As(err, &we) && we.Scope == store.ScopeShared {
			if we.RetryAfter <= time.Second || we.RetryAfter > 2*time.Second {
				t.Errorf("process b holds the resource for %v; want the 2s the 429 named, less the note's way", we.RetryAfter)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("process b never learned of the shared 429 process a met")
		}
		time.Sleep(2 * time.Millisecond)
	}
	// Another message of the same bucket goes, in both processes.
	for _, s := range []*redisstore.Store{a, b} {
		actx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		r, err := s.Acquire(actx, claim("2"))
		cancel()
		if err != nil {
			t.Fatalf("another resource of the bucket: %v; want it granted", err)
		}
		r.Cancel()
	}
}
