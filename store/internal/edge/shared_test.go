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
	if g.ResourceHeld(&c) || g.sharedOn.Load() {
		t.Error("the hold outlived its wait")
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
