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

// maxShared bounds the resources held at once: a shared 429 beyond it
// holds its bucket instead (see Gates.Settle).
const maxShared = 4096

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

// holdResource holds res until then; g.mu is held.
func (g *Gates) holdResource(res uint64, until time.Time) bool {
	if res == 0 {
		return false
	}
	if g.shared == nil {
		g.shared = make(map[uint64]time.Time)
	}
	if _, ok := g.shared[res]; !ok && len(g.shared) >= maxShared {
		now := g.clk.Now()
		for k, t := range g.shared {
			if !now.Before(t) {
				delete(g.shared, k)
			}
		}
		if len(g.shared) >= maxShared {
			return false
		}
	}
	g.shared[res] = later(g.shared[res], until)
	g.sharedOn.Store(true)
	return true
}

// resourceWait returns how long resource res is held from now (0: not
// held), forgetting holds that ended; g.mu is held.
func (g *Gates) resourceWait(res uint64, now time.Time) time.Duration {
	until, ok := g.shared[res]
	if !ok {
		return 0
	}
	if !now.Before(until) {
		delete(g.shared, res)
		if len(g.shared) == 0 {
			g.sharedOn.Store(false)
		}
		return 0
	}
	return until.Sub(now)
}

// ResourceHeld reports whether a shared 429 now holds the resource of
// claim c. It takes no lock while no resource is held.
func (g *Gates) ResourceHeld(c *store.Claim) bool {
	if !g.sharedOn.Load() {
		return false
	}
	return g.resourceHeld(Resource(c))
}

// resourceHeld reports whether a shared 429 now holds resource res.
func (g *Gates) resourceHeld(res uint64) bool {
	if res == 0 {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.resourceWait(res, g.clk.Now()) > 0
}

// awaitResource holds claim c while a shared 429 holds its resource res
// (see Resource). It
// fails like a store's Acquire: with a *store.WaitError of scope shared,
// at once when the wait is known to exceed what the claim accepts.
func (g *Gates) awaitResource(ctx context.Context, c *store.Claim, res uint64, start time.Time, done <-chan struct{}) error {
	if res == 0 {
		return nil
	}
	var expired <-chan time.Time
	for {
		g.mu.Lock()
		now := g.clk.Now()
		wait := g.resourceWait(res, now)
		g.mu.Unlock()
		if wait <= 0 {
			return nil
		}
		if c.NoWait {
			return &store.WaitError{Scope: store.ScopeShared, RetryAfter: wait, Err: store.ErrWaitTooLong}
		}
		if err := store.CheckWait(ctx, c, start, now.Sub(start)+wait); err != nil {
			return &store.WaitError{Scope: store.ScopeShared, RetryAfter: wait, Err: err}
		}
		if expired == nil && c.MaxWait > 0 {
			t := g.clk.NewTimer(max(c.MaxWait-now.Sub(start), 0))
			defer t.Stop()
			expired = t.C()
		}
		if err := g.sleep(ctx, c, done, nil, wait, expired); err != nil {
			return &store.WaitError{Scope: store.ScopeShared, RetryAfter: wait, Err: err}
		}
	}
}

// settleShared applies a 429 of scope shared on claim c: its resource is
// held for the wait the 429 names, here and, through the remote, in every
// process of the store. It reports whether the resource is held; when it
// is, the store leaves the bucket alone.
func (g *Gates) settleShared(c *store.Claim, u *store.Update) bool {
	res := Resource(c)
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
