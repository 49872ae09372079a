package edge

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord/store"
)

// A block tells the store that it went past a limit no header announces,
// whose size the block does not say either. After one, the store paces the
// blocked route (or, for a gate of the whole store, every request): it
// counts the requests of this process that passed the edge (answered with
// anything but a block) in the PaceWindow before the block, and from then
// on lets out at most three quarters of that per PaceWindow, one request
// every PaceWindow/n. A block that comes after the pace let requests out
// halves its rate (down to one request per the longest block pause). Each
// process paces by what passed for itself: the processes sharing an IP
// address together stay under three quarters of what passed for the IP
// before it was blocked, without a shared counter on every request. A pace
// is forgotten PaceMemory after the block that set it, so that a limit
// that rose is found again, at the cost of at most one block per
// PaceMemory. A process that had nothing pass in the window before a block
// learns no pace from it.
//
// Like TCP's congestion control, a pace probes upward: after RaiseAfter
// without a block, during which the pace held requests back, it lets one
// request more per PaceWindow. A block after a raise sets the pace back to
// the rate that ran clean before it, and doubles the time before the next
// raise (up to PaceMemory), so that the edge is found within a request or
// two per PaceWindow at the cost of a block now and then, rarer and rarer;
// only a block at a rate that had run clean halves it.
const (
	PaceWindow = time.Second
	PaceMemory = 10 * time.Minute
	RaiseAfter = 5 * PaceWindow
)

// slotWidth is the width of the slots in which passes are counted; slots
// is how many a ring keeps, more than PaceWindow holds.
const (
	slotWidth = 100 * time.Millisecond
	slots     = 16
)

// maxCounted bounds the routes whose passes are counted one by one; those
// of routes beyond it are counted together, and a block of such a route
// learns from the count of the whole store (more than passed on the route: a
// looser pace, which a second block halves).
const maxCounted = 256

// maxPaces bounds the routes paced at once; a block of one more paces the
// whole store.
const maxPaces = 64

// ring counts passes in slots of slotWidth; each slot holds its slot
// number (high 32 bits) and its count (low 32 bits).
type ring struct{ slot [slots]atomic.Uint64 }

func (r *ring) add(n uint32) {
	s := &r.slot[n%slots]
	for {
		v := s.Load()
		if uint32(v>>32) == n {
			s.Add(1)
			return
		}
		if s.CompareAndSwap(v, uint64(n)<<32|1) {
			return
		}
	}
}

// sum returns the passes of the k slots up to slot n.
func (r *ring) sum(n uint32, k int) int {
	total := 0
	for i := range uint32(k) {
		m := n - i
		if v := r.slot[m%slots].Load(); uint32(v>>32) == m {
			total += int(uint32(v))
		}
	}
	return total
}

// passes counts the requests of this process that passed the edge, by
// route: one atomic addition per response.
type passes struct {
	routes sync.Map // route -> *ring
	n      atomic.Int32
	others ring // the routes beyond maxCounted
}

func slotOf(t time.Time) uint32 { return uint32(t.UnixMilli() / slotWidth.Milliseconds()) }

func (s *passes) add(route string, n uint32) {
	if r, ok := s.routes.Load(route); ok {
		r.(*ring).add(n)
		return
	}
	if s.n.Load() >= maxCounted {
		s.others.add(n)
		return
	}
	r, loaded := s.routes.LoadOrStore(route, new(ring))
	if !loaded {
		s.n.Add(1)
	}
	r.(*ring).add(n)
}

// count returns the requests of key (a route, or All) that passed in the
// PaceWindow up to t.
func (s *passes) count(key string, t time.Time) int {
	n, k := slotOf(t), int(PaceWindow/slotWidth)
	if key != All {
		if r, ok := s.routes.Load(key); ok {
			return r.(*ring).sum(n, k)
		}
	}
	total := s.others.sum(n, k)
	s.routes.Range(func(_, r any) bool {
		total += r.(*ring).sum(n, k)
		return true
	})
	return total
}

// pace is what a block taught of a route (or of the store, All).
type pace struct {
	every time.Duration // one request per every
	next  time.Time     // the next may go then
	until time.Time     // forgotten then
	tried bool          // a request other than a block's probe went out under it

	// Probing upward: good is the pace before the last raise (0: none
	// since the block), set is when every was set, raiseAfter how long it
	// must run clean, and held whether it held a request back since.
	good       time.Duration
	set        time.Time
	raiseAfter time.Duration
	held       bool
}

// raise lets one request more per PaceWindow through p, when it ran clean
// for its raiseAfter while holding requests back; now is the time.
func (p *pace) raise(now time.Time) {
	if !p.held || now.Sub(p.set) < p.raiseAfter {
		return
	}
	n := int64((PaceWindow + p.every/2) / p.every) // requests per window now, rounded
	every := (PaceWindow/time.Duration(n+1) + time.Millisecond - 1).Truncate(time.Millisecond)
	if every >= p.every {
		return
	}
	p.good, p.every, p.set, p.held = p.every, every, now, false
}

// learn sets, or halves, the pace of key after a block this process met
// or heard of at now; g.mu is held.
func (g *Gates) learn(key string, now time.Time) {
	if _, ok := g.paces[key]; !ok && key != All && len(g.paces) >= maxPaces {
		key = All // bounded: blocks on that many routes are the IP's
	}
	n := g.passed.count(key, now)
	// Rounded up to the millisecond, so that a window never holds one
	// more.
	every := (PaceWindow/time.Duration(max(n*3/4, 1)) + time.Millisecond - 1).Truncate(time.Millisecond)
	p := g.paces[key]
	raiseAfter := RaiseAfter
	if p != nil && now.Before(p.until) {
		if !p.tried {
			// Nothing went out under the pace yet: the same block.
			return
		}
		raiseAfter = p.raiseAfter
		if p.good > p.every {
			// Blocked after a raise: back to the rate that ran clean,
			// and the next raise waits twice as long.
			every = p.good
			raiseAfter = min(2*p.raiseAfter, PaceMemory)
		} else {
			// Blocked at a rate that had run clean: the pace was too loose.
			every = min(2*p.every, max(g.max, PaceWindow, p.every))
		}
	} else if n == 0 {
		// Nothing of this process passed there: it has nothing to learn,
		// and pacing it would hold back a process that just started.
		return
	}
	if p == nil {
		p = &pace{}
		g.paces[key] = p
	}
	p.every, p.until, p.tried = every, now.Add(PaceMemory), false
	p.good, p.set, p.raiseAfter, p.held = 0, now, raiseAfter, false
	if g.paceSweep.IsZero() || p.until.Before(g.paceSweep) {
		g.paceSweep = p.until
	}
	g.broadcast()
}

// paceOf returns the pace of key: one request per the returned interval,
// 0 when key is not paced.
func (g *Gates) paceOf(key string) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p := g.paces[key]; p != nil && g.clk.Now().Before(p.until) {
		return p.every
	}
	return 0
}

// paced returns the paces that hold a claim on route; g.mu is held. It
// forgets the paces whose memory ran out, of every route: a store whose
// paces are gone takes the fast path again.
func (g *Gates) paced(route string, now time.Time) []*pace {
	if !g.paceSweep.IsZero() && !now.Before(g.paceSweep) {
		g.paceSweep = time.Time{}
		for k, p := range g.paces {
			if !now.Before(p.until) {
				delete(g.paces, k)
			} else if g.paceSweep.IsZero() || p.until.Before(g.paceSweep) {
				g.paceSweep = p.until
			}
		}
		g.broadcast()
	}
	var ps []*pace
	for _, k := range [2]string{All, route} {
		if p := g.paces[k]; p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// awaitPace holds a claim on route, granted its slot, until the paces of
// its route let it go, in arrival order; probe reports that the claim
// probes a block. It fails like [Gates.Wait]; the claim's MaxWait counts
// from now.
func (g *Gates) awaitPace(ctx context.Context, c store.Claim, probe bool, done <-chan struct{}) error {
	start := g.clk.Now()
	maxWait := c.MaxWait
	g.mu.Lock()
	if len(g.paces) == 0 {
		g.mu.Unlock()
		return nil
	}
	seq, leave := g.join(g.pacing, c.Route)
	defer leave()
	var expired <-chan time.Time
	for {
		now := g.clk.Now()
		ps := g.paced(c.Route, now)
		var at time.Time
		for _, p := range ps {
			at = later(at, p.next)
		}
		if !now.Before(at) && g.firstPaced(seq, c.Route) {
			for _, p := range ps {
				p.raise(now)
				p.next = later(p.next, now).Add(p.every)
				p.tried = p.tried || !probe
			}
			g.broadcast()
			g.mu.Unlock()
			return nil
		}
		wait := max(at.Sub(now), 0)
		for _, p := range ps {
			p.held = true // it binds: worth probing upward
		}
		ch := g.changed
		g.mu.Unlock()
		if c.NoWait {
			// Not at once: the pace, or a claim ahead in its line, holds it.
			return &store.WaitError{Scope: store.ScopeBlocked, RetryAfter: max(wait, 1), Err: store.ErrWaitTooLong}
		}
		if maxWait > 0 {
			c.MaxWait = max(maxWait-now.Sub(start), 1)
		}
		if err := store.CheckWait(ctx, &c, now, wait); err != nil {
			return &store.WaitError{Scope: store.ScopeBlocked, RetryAfter: wait, Err: err}
		}
		if expired == nil && maxWait > 0 {
			t := g.clk.NewTimer(max(maxWait-g.clk.Now().Sub(start), 0))
			defer t.Stop()
			expired = t.C()
		}
		if err := g.sleep(ctx, &c, done, ch, wait, expired); err != nil {
			return &store.WaitError{Scope: store.ScopeBlocked, RetryAfter: wait, Err: err}
		}
		g.mu.Lock()
	}
}

// firstPaced reports whether seq is the earliest claim waiting for the
// pace of route (or, under a pace of the whole store, for any pace); g.mu
// is held.
func (g *Gates) firstPaced(seq uint64, route string) bool {
	_, all := g.paces[All]
	for s, r := range g.pacing {
		if s < seq && (all || r == route) {
			return false
		}
	}
	return true
}
