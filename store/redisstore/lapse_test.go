package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// TestGrantLapses: a grant through Redis lapses half the hold after the
// call that made it left, whether its claim counts against the global
// window or not; cancelled, it gives its slot back.
func TestGrantLapses(t *testing.T) {
	c := stepClient(t)
	const hold = 400 * time.Millisecond
	s := New(c, WithPrefix("ratecordtest:lapse:"+time.Now().Format(time.RFC3339Nano)),
		WithPolicy(store.Policy{GlobalHold: hold}), WithLease(0))
	t.Cleanup(func() { s.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()

	g := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true, GlobalLimit: 1}
	before := time.Now()
	p, err := s.Acquire(ctx, g)
	if err != nil {
		t.Fatalf("Acquire = %v; want a grant", err)
	}
	after := time.Now()
	if p.SendBy.Before(before.Add(hold/2)) || p.SendBy.After(after.Add(hold/2)) {
		t.Fatalf("SendBy = %v; want half the hold after the call, in [%v, %v]", p.SendBy, before.Add(hold/2), after.Add(hold/2))
	}
	if p.Lapsed() && !time.Now().After(p.SendBy) {
		t.Fatal("Lapsed() = true before SendBy")
	}
	time.Sleep(time.Until(p.SendBy) + 5*time.Millisecond)
	if !p.Lapsed() {
		t.Fatalf("Lapsed() = false past SendBy; want true")
	}

	// Cancelled, the lapsed grant's slot of the full global window is
	// free again at once.
	p.Cancel()
	g.NoWait = true
	q, err := s.Acquire(ctx, g)
	if err != nil {
		t.Fatalf("Acquire after the lapsed grant was cancelled = %v; want its global slot at once", err)
	}
	q.Cancel()

	// A claim the global limit does not count lapses as well: a pause or
	// a window the other processes learned meanwhile must not be missed.
	// Given back, its bucket slot is free again at once.
	e := store.Claim{Credential: "bot", Route: "POST /interactions/:id/:token/callback", Major: "interactions/1"}
	before = time.Now()
	r, err := s.Acquire(ctx, e)
	if err != nil {
		t.Fatalf("Acquire(interaction) = %v; want a grant", err)
	}
	if r.SendBy.Before(before.Add(hold/2)) || r.SendBy.After(time.Now().Add(hold/2)) {
		t.Fatalf("SendBy = %v for a claim outside the global window; want half the hold after the call", r.SendBy)
	}
	r.Report(ctx, store.Update{Sent: true, Status: 204, Bucket: "i", HasLimit: true, Limit: 1, Remaining: 0, ResetAfter: 10 * time.Second})
	e.Major = "interactions/2"
	r, err = s.Acquire(ctx, e)
	if err != nil {
		t.Fatalf("Acquire(interaction 2) = %v; want a grant", err)
	}
	time.Sleep(time.Until(r.SendBy) + 5*time.Millisecond)
	if !r.Lapsed() {
		t.Fatalf("Lapsed() = false past SendBy for a claim outside the global window; want true")
	}
	r.Cancel()
	e.NoWait = true
	r, err = s.Acquire(ctx, e)
	if err != nil {
		t.Fatalf("Acquire after the lapsed grant was cancelled = %v; want its bucket slot at once", err)
	}
	r.Cancel()
}
