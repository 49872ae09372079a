package memstore

import (
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// TestGrantLapses: a grant of a claim that counts against the global
// window lapses half the hold after it was made, on the store's clock,
// whether it was made at once or to a waiter; a cancelled lapsed grant
// gives its slot back; claims outside the global window lapse alike.
func TestGrantLapses(t *testing.T) {
	s, clk := newFake(t)
	half := store.DefaultGlobalHold / 2
	c := claim("POST /channels/:id/messages", "channels/1")
	c.Global, c.GlobalLimit = true, 1

	p := acquire(t, s, c)
	if want := clk.Now().Add(half); !p.SendBy.Equal(want) {
		t.Fatalf("SendBy = %v; want %v, half the hold after the grant", p.SendBy, want)
	}
	clk.Advance(half)
	if p.Lapsed() {
		t.Fatalf("Lapsed() = true at SendBy; want false until it has passed")
	}
	clk.Advance(time.Millisecond)
	if !p.Lapsed() {
		t.Fatalf("Lapsed() = false past SendBy; want true")
	}

	// Cancelled, the lapsed grant's global slot is free at once.
	p.Cancel()
	c.NoWait = true
	p = acquire(t, s, c)
	c.NoWait = false

	// A waiter granted later lapses half the hold after its own grant.
	armed := clk.Timers()
	ch := acquireAsync(t, s, c)
	pending(t, ch, "a second claim on a full global window")
	clk.Advance(100 * time.Millisecond)
	update(t, s, p, headers(c, "h", 5, 4, time.Second)) // its window starts now
	waitFor(t, func() bool { return clk.Timers() > armed }, "the global timer")
	clk.Advance(time.Second)
	q := granted(t, ch, "the waiter, once the global window opens")
	if want := clk.Now().Add(half); !q.SendBy.Equal(want) {
		t.Fatalf("waiter's SendBy = %v; want %v, half the hold after its grant", q.SendBy, want)
	}
	q.Cancel()

	// A claim the global limit does not count lapses as well; given
	// back, its bucket slot is free again at once.
	e := claim("POST /interactions/:id/:token/callback", "interactions/1")
	r := acquire(t, s, e)
	update(t, s, r, headers(e, "i", 1, 0, 10*time.Second))
	e.Major = "interactions/2"
	r = acquire(t, s, e)
	if want := clk.Now().Add(half); !r.SendBy.Equal(want) {
		t.Fatalf("SendBy = %v for a claim outside the global window; want %v", r.SendBy, want)
	}
	clk.Advance(half + time.Millisecond)
	if !r.Lapsed() {
		t.Fatalf("Lapsed() = false past SendBy for a claim outside the global window; want true")
	}
	r.Cancel()
	e.NoWait = true
	acquire(t, s, e).Cancel()
}
