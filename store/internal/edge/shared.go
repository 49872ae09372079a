package edge

import (
	"context"
	"time"

	"github.com/ratecord/ratecord/store"
)

// A 429 of scope shared limits one resource that every client shares (a
// message's reactions, an emoji), not the route's bucket: Discord says how
// long, and for which request. The gates hold the claims of that resource,
// of the credential that met it, until the wait ends; the route's other
// resources keep their bucket's full rate. A resource is named by a digest
// of the credential, the route and the request's path (see Resource), so
// the gates keep no path, and processes sharing a store name it alike.
//
// When the wait ends, the resource's limit is still unknown: its claims
// that piled up meanwhile would all go at once, and those beyond what the
// resource has left meet another shared 429 each. So a resource takes its
// requests up again the way TCP avoids congestion: one in flight at a
// time, then one more each time as many of its requests as may be in
// flight have passed, without limit from maxOpen on; another shared 429
// starts over. A resource that no shared 429 held for sharedQuiet after
// its last one is forgotten.

// maxShared bounds the resources held at once: a shared 429 beyond it
// holds its bucket instead (see Gates.Settle).
const maxShared = 4096

// maxOpen is the number of requests of a resource in flight at once from
// which the gates stop counting them (see resource.open).
const maxOpen = 32

// sharedQuiet is how long after the end of its last hold a resource that
// no shared 429 held again is forgotten.
const sharedQuiet = 10 * time.Second

// resource is what shared 429s taught of one resource.
type resource struct {
	until time.Time // held until then
	// open is how many requests of it may be in flight at once, 0 for
	// any number, and passed how many passed since it was last raised;
	// out holds those in flight, with when each left the wait (one whose
	// report never comes counts for Lease at most): the mark of a claim
	// its bucket has not granted yet, the reservation of one it has.
	open, passed int
	out          map[any]time.Time
}

// mark is a claim's place among the requests of its resource in flight
// (see resource.out) from when it leaves the resource's wait until its
// bucket grants it, when its reservation takes the place.
type mark struct{ _ byte }

// busy reports whether the resource's requests in flight fill what it may
// have, forgetting those out longer than Lease.
func (r *resource) busy(now time.Time) bool {
	if r.open == 0 || len(r.out) < r.open {
		return false
	}
	for k, at := range r.out {
		if now.Sub(at) >= Lease {
			delete(r.out, k)
		}
	}
	return len(r.out) >= r.open
}

// take counts k (a claim's mark or a reservation) among the resource's
// requests in flight from now.
func (r *resource) take(k any, now time.Time) {
	if r.out == nil {
		r.out = make(map[any]time.Time)
	}
	r.out[k] = now
}

// lapse returns how long from now until the oldest of the resource's
// requests in flight stops counting (see busy).
func (r *resource) lapse(now time.Time) time.Duration {
	var first time.Time
	for _, at := range r.out {
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return max(first.Add(Lease).Sub(now), time.Millisecond)
}

// Resource returns the digest that names the resource of claim c: 64-bit
// FNV-1a of its credential, route and path. It is 0 when the path is not
// known.
func Resource(c *store.Claim) uint64 {
	if c.Path == "" {
		return 0
	}
	const offset64, prime64 = 14695981039346656037, 1099511628211
	h := uint64(offset64)
	for _, s := range [...]string{c.Credential, c.Route, c.Path} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= prime64
		}
		h ^= 0xff // a byte no string here ends with: the parts stay apart
		h *= prime64
	}
	return max(h, 1)
}

// SetOffset sets the safety margin added to the waits of shared 429s (the
// store's reset offset).
func (g *Gates) SetOffset(d time.Duration) {
	g.mu.Lock()
	g.offset = d
	g.mu.Unlock()
}

// HoldResource holds the claims of resource res for d from now, as a
// shared 429 that another process met asks. It reports whether the
// resource is held (false when too many are).
func (g *Gates) HoldResource(res uint64, d time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.holdResource(res, g.clk.Now().Add(d))
}

// holdResource holds res until then, and has it take up its requests
// again from one at a time; g.mu is held.
func (g *Gates) holdResource(res uint64, until time.Time) bool {
	if res == 0 {
		return false
	}
	if g.shared == nil {
		g.shared = make(map[uint64]*resource)
	}
	r := g.shared[res]
	if r == nil {
		if len(g.shared) >= maxShared {
			// Make room: what was learned of resources no longer held,
			// none of whose requests is out, is only a courtesy.
			now := g.clk.Now()
			for k, o := range g.shared {
				if !now.Before(o.until) && len(o.out) == 0 {
					delete(g.shared, k)
				}
			}
			if len(g.shared) >= maxShared {
				return false
			}
		}
		r = &resource{}
		g.shared[res] = r
	}
	r.until = later(r.until, until)
	r.open, r.passed = 1, 0
	g.sharedOn.Store(true)
	return true
}

// resourceWait returns how long resource res is held from now (0: not
// held), and whether its requests in flight fill what it may have;
// forgets it once quiet. g.mu is held.
func (g *Gates) resourceWait(res uint64, now time.Time) (time.Duration, bool) {
	r, ok := g.shared[res]
	if !ok {
		return 0, false
	}
	if now.Before(r.until) {
		return r.until.Sub(now), false
	}
	if r.busy(now) {
		return 0, true
	}
	if len(r.out) == 0 && !now.Before(r.until.Add(sharedQuiet)) {
		delete(g.shared, res)
		if len(g.shared) == 0 {
			g.sharedOn.Store(false)
		}
	}
	return 0, false
}

// ResourceHeld reports whether a shared 429 now holds the resource of
// claim c. It takes no lock while no resource is held.
func (g *Gates) ResourceHeld(c *store.Claim) bool {
	if !g.sharedOn.Load() {
		return false
	}
	res := Resource(c)
	if res == 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	wait, _ := g.resourceWait(res, g.clk.Now())
	return wait > 0
}

// takeResource puts p, granted for a claim of resource res that took
// place (nil: none) when it left the resource's wait, among the resource's
// requests in flight until it settles, and reports true; it reports false,
// giving the place up, when a shared 429 holds the resource again, or when
// the claim took no place and the resource's requests in flight fill what
// it may have: p must not go.
func (g *Gates) takeResource(res uint64, place *mark, p *store.Reservation) bool {
	if res == 0 {
		return true
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clk.Now()
	r := g.shared[res]
	if r != nil && place != nil {
		if _, ok := r.out[place]; ok {
			delete(r.out, place)
			if now.Before(r.until) {
				g.broadcast()
				return false
			}
			r.take(p, now)
			return true
		}
	}
	if wait, busy := g.resourceWait(res, now); wait > 0 || busy {
		return false
	}
	if r = g.shared[res]; r != nil && r.open > 0 {
		r.take(p, now)
	}
	return true
}

// dropResource gives up place, taken by a claim of resource res that will
// not go (nil: none).
func (g *Gates) dropResource(res uint64, place *mark) {
	if place == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if r := g.shared[res]; r != nil {
		if _, ok := r.out[place]; ok {
			delete(r.out, place)
			g.broadcast()
		}
	}
}

// settleResource takes p, a reservation of resource res (see Resource),
// out of the resource's requests in flight: one that Discord answered
// other than with a 429 passed, and once as many passed as may be in
// flight, the resource may have one more (a shared 429 holds it again,
// see settleShared).
func (g *Gates) settleResource(res uint64, p *store.Reservation, u *store.Update) {
	if res == 0 || p == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	r := g.shared[res]
	if r == nil {
		return
	}
	if _, ok := r.out[p]; !ok {
		return
	}
	delete(r.out, p)
	if u.Sent && u.Status > 0 && u.Status != 429 && r.open > 0 {
		if r.passed++; r.passed >= r.open {
			r.open, r.passed = r.open+1, 0
		}
		if r.open >= maxOpen {
			r.open = 0
			clear(r.out)
		}
	}
	g.broadcast()
}

// awaitResource holds claim c while a shared 429 holds its resource res
// (see Resource), or while the resource's requests in flight fill what it
// may have, and returns the place c then takes among them (nil when the
// resource counts none). It fails like a store's Acquire: with a
// *store.WaitError of scope shared, at once when the wait is known to
// exceed what the claim accepts (a claim that will not wait fails at once
// in both cases).
func (g *Gates) awaitResource(ctx context.Context, c *store.Claim, res uint64, start time.Time, done <-chan struct{}) (*mark, error) {
	if res == 0 {
		return nil, nil
	}
	var expired <-chan time.Time
	for {
		g.mu.Lock()
		now := g.clk.Now()
		wait, busy := g.resourceWait(res, now)
		if wait <= 0 && !busy {
			var place *mark
			if r := g.shared[res]; r != nil && r.open > 0 {
				place = new(mark)
				r.take(place, now)
			}
			g.mu.Unlock()
			return place, nil
		}
		ch := g.changed
		var lapse time.Duration
		if busy {
			lapse = g.shared[res].lapse(now)
		}
		g.mu.Unlock()
		if c.NoWait {
			return nil, &store.WaitError{Scope: store.ScopeShared, RetryAfter: wait, Err: store.ErrWaitTooLong}
		}
		if err := store.CheckWait(ctx, c, start, now.Sub(start)+wait); err != nil {
			return nil, &store.WaitError{Scope: store.ScopeShared, RetryAfter: wait, Err: err}
		}
		if expired == nil && c.MaxWait > 0 {
			t := g.clk.NewTimer(max(c.MaxWait-now.Sub(start), 0))
			defer t.Stop()
			expired = t.C()
		}
		d := wait
		if busy {
			// A response of the resource wakes it (see settleResource),
			// or, should none ever be reported, its request's lapse.
			d = lapse
		} else {
			ch = nil
		}
		if err := g.sleep(ctx, c, done, ch, d, expired); err != nil {
			return nil, &store.WaitError{Scope: store.ScopeShared, RetryAfter: wait, Err: err}
		}
	}
}

// settleShared applies a 429 of scope shared, u, on resource res: it is
// held for the wait the 429 names, here and, through the remote, in every
// process of the store. It reports whether the resource is held; when it
// is, the store leaves the bucket alone.
func (g *Gates) settleShared(res uint64, u *store.Update) bool {
	if res == 0 || u.RetryAfter <= 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	d := store.ClampDuration(u.RetryAfter) + g.offset
	ok := g.holdResource(res, g.clk.Now().Add(d))
	if ok {
		g.background(func(ctx context.Context) { _ = g.remote.Shared(ctx, res, d) })
	}
	return ok
}
