package edge

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

func TestResourceNamesCredentialRouteAndPath(t *testing.T) {
	base := store.Claim{Credential: "c", Route: "PUT /a/:id", Path: "/a/1"}
	seen := map[uint64]string{Resource(&base): "base"}
	for name, c := range map[string]store.Claim{
		"other credential": {Credential: "d", Route: base.Route, Path: base.Path},
		"other route":      {Credential: "c", Route: "DELETE /a/:id", Path: base.Path},
		"other path":       {Credential: "c", Route: base.Route, Path: "/a/2"},
		"parts moved":      {Credential: "cP", Route: "UT /a/:id", Path: base.Path},
	} {
		r := Resource(&c)
		if prev, dup := seen[r]; dup {
			t.Errorf("%s names the same resource as %s", name, prev)
		}
		seen[r] = name
	}
	if r := Resource(&store.Claim{Credential: "c", Route: base.Route}); r != 0 {
		t.Errorf("a claim without a path names resource %x; want 0 (unknown)", r)
	}
}

// TestSharedHoldsItsResource: a shared 429 holds its resource for the wait
// it names plus the offset, claims of it wait (or fail at once when they
// will not), and the store is told to leave the bucket alone.
func TestSharedHoldsItsResource(t *testing.T) {
	g, clk := newGates(t)
	g.SetOffset(10 * time.Millisecond)
	c := store.Claim{Credential: "c", Route: "PUT /r", Path: "/r/1"}
	u := store.Update{Sent: true, Status: 429, Scope: store.ScopeShared, RetryAfter: 500 * time.Millisecond}
	g.Settle(&store.Reservation{}, &c, &u)
	if u.RetryAfter != 0 {
		t.Errorf("the update's RetryAfter is %v after the gates held the resource; want 0 so the bucket is left alone", u.RetryAfter)
	}
	if !g.ResourceHeld(&c) {
		t.Fatal("the resource is not held")
	}
	other := c
	other.Path = "/r/2"
	if g.ResourceHeld(&other) {
		t.Error("another resource of the route is held")
	}
	nowait := c
	nowait.NoWait = true
	_, err := g.Acquire(context.Background(), nowait, clk.Now(), nil, func(store.Claim) (*store.Reservation, error) {
		t.Fatal("a held resource reached its bucket")
		return nil, nil
	})
	var we *store.WaitError
	if !errors.As(err, &we) || we.Scope != store.ScopeShared || we.RetryAfter != 510*time.Millisecond {
		t.Fatalf("NoWait claim of the held resource: %v; want a WaitError of scope shared, retry after 510ms", err)
	}
	got := make(chan error, 1)
	go func() {
		_, err := g.Acquire(context.Background(), c, clk.Now(), nil, func(store.Claim) (*store.Reservation, error) {
			return &store.Reservation{}, nil
		})
		got <- err
	}()
	for clk.Timers() == 0 {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(509 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("granted before the wait ended")
	case <-time.After(20 * time.Millisecond):
	}
	clk.Advance(time.Millisecond)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if g.ResourceHeld(&c) {
		t.Error("the hold outlived its wait")
	}
}

// TestSharedResourceSlowStart: once its hold ends, a resource takes up its
// requests one in flight at a time, one more once as many as may be in
// flight have passed, and another shared 429 starts over; a resource left
// quiet is forgotten.
func TestSharedResourceSlowStart(t *testing.T) {
	g, clk := newGates(t)
	c := store.Claim{Credential: "c", Route: "PUT /r", Path: "/r/1"}
	// Settle clears the RetryAfter of the update it takes.
	shared := func() *store.Update {
		return &store.Update{Sent: true, Status: 429, Scope: store.ScopeShared, RetryAfter: 100 * time.Millisecond}
	}
	g.Settle(&store.Reservation{}, &c, shared())
	clk.Advance(100 * time.Millisecond)

	acquire := func() (<-chan *store.Reservation, <-chan error) {
		got, failed := make(chan *store.Reservation, 1), make(chan error, 1)
		go func() {
			r, err := g.Acquire(context.Background(), c, clk.Now(), nil, func(store.Claim) (*store.Reservation, error) {
				return &store.Reservation{}, nil
			})
			if err != nil {
				failed <- err
				return
			}
			got <- r
		}()
		return got, failed
	}
	granted := func(got <-chan *store.Reservation, failed <-chan error, what string) *store.Reservation {
		t.Helper()
		select {
		case r := <-got:
			return r
		case err := <-failed:
			t.Fatalf("%s: %v", what, err)
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: still waiting", what)
		}
		return nil
	}
	waiting := func(got <-chan *store.Reservation, what string) {
		t.Helper()
		select {
		case <-got:
			t.Fatalf("%s went while the resource's requests in flight filled what it may have", what)
		case <-time.After(30 * time.Millisecond):
		}
	}
	at := func(what string) *store.Reservation {
		t.Helper()
		got, failed := acquire()
		return granted(got, failed, what)
	}
	passed := store.Update{Sent: true, Status: 204}

	first := at("the first request after the hold")
	got2, failed2 := acquire()
	waiting(got2, "a second request while the first after the hold is out")
	g.Settle(first, &c, &passed)
	second := granted(got2, failed2, "the request behind one that passed")
	third := at("a second request in flight after one passed")
	got4, failed4 := acquire()
	waiting(got4, "a third request in flight after one passed")
	if other := (store.Claim{Credential: "c", Route: "PUT /r", Path: "/r/2"}); g.ResourceHeld(&other) {
		t.Error("another resource of the route is held")
	}
	g.Settle(second, &c, &passed)
	fourth := granted(got4, failed4, "a request behind two in flight, one answered")
	got5, failed5 := acquire()
	waiting(got5, "a third request in flight when one of two passed")

	// Another shared 429 holds it and starts over from one at a time.
	g.Settle(third, &c, shared())
	if !g.ResourceHeld(&c) {
		t.Fatal("a second shared 429 did not hold the resource")
	}
	clk.Advance(100 * time.Millisecond)
	waiting(got5, "a request after the second hold while one from before it is out")
	g.Settle(fourth, &c, &store.Update{}) // not sent: out, but it did not pass
	fifth := granted(got5, failed5, "the first request after the second hold")
	got6, failed6 := acquire()
	waiting(got6, "a second request after the second hold")
	g.Settle(fifth, &c, &passed)
	sixth := granted(got6, failed6, "the request behind one that passed")
	g.Settle(sixth, &c, &passed)

	// A request whose report never comes counts for Lease at most.
	// (Two may be out now: the fifth passed.)
	at("a request after the last one passed")
	at("a second request in flight")
	got7, failed7 := acquire()
	waiting(got7, "a request while one never reported is out")
	for deadline := time.Now().Add(2 * time.Second); clk.Timers() < 1 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	clk.Advance(Lease)
	seventh := granted(got7, failed7, "a request once the one never reported lapsed")
	g.Settle(seventh, &c, &passed)

	clk.Advance(sharedQuiet)
	if g.ResourceHeld(&c) {
		t.Error("held after its quiet time")
	}
	r := at("a request after the quiet time")
	g.Settle(r, &c, &passed)
	if g.sharedOn.Load() {
		t.Error("a resource left quiet after its last hold is still remembered")
	}
}

// TestSharedHoldsAreBounded: past maxShared held resources, a shared 429
// is left to the store (which holds the bucket), and holds that ended
// make room.
func TestSharedHoldsAreBounded(t *testing.T) {
	g, clk := newGates(t)
	for i := range uint64(maxShared) {
		if !g.HoldResource(i+1, time.Second) {
			t.Fatalf("hold %d refused below the bound", i)
		}
	}
	if g.HoldResource(maxShared+1, time.Second) {
		t.Fatal("a hold beyond the bound was kept")
	}
	c := store.Claim{Credential: "c", Route: "PUT /r", Path: "/r/1"}
	u := store.Update{Sent: true, Status: 429, Scope: store.ScopeShared, RetryAfter: time.Second}
	g.Settle(&store.Reservation{}, &c, &u)
	if u.RetryAfter != time.Second {
		t.Error("a shared 429 beyond the bound was not left to the store")
	}
	clk.Advance(time.Second)
	if !g.HoldResource(maxShared+1, time.Second) {
		t.Error("ended holds made no room")
	}
	if n := len(g.shared); n != 1 {
		t.Errorf("%d holds kept; want 1", n)
	}
}
