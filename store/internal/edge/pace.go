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
// anything but a block) in the PaceWindow before the block, n, and from
// then on lets out at most nine tenths of that per PaceWindow, one request
// every PaceWindow/(0.9 n). The tenth kept back leaves the spacing a
// tenth of the window (100 ms) of slack, more than the network's jitter
// can take from it, so evenly spaced requests never bunch into n+1 within
// a window of the edge. Requests sent before the block and answered after
// it passed too: the first request the pace lets out counts them again
// (see recount). A block that comes after the pace let requests out
// halves its rate (down to one request per the longest block pause). Each
// process paces by what passed for itself: the processes sharing an IP
// address together stay under nine tenths of what passed for the IP
// before it was blocked, without a shared counter on every request. A pace
// is forgotten PaceMemory after the block that set it, so that a limit
// that rose is found again, at the cost of at most one block per
// PaceMemory. A process that had nothing pass in the window before a block
// (its first requests still in flight: processes that start together meet
// the edge together) is paced by those of them that passed, counted once
// their answers are in; if none did, it learns no pace from the block.
//
// Like TCP's congestion control, a pace probes upward: after RaiseAfter
// without a block, during which the pace held requests back, it lets one
// request more per PaceWindow, as long as that stays within nine tenths of
// the rate the edge last refused (the ceiling: what passed before the
// first block, or the rate a later block came at). Past that, where the
// edge was met, a raise waits ProbeAfter, and each block after such a
// raise sets the pace back to the rate that ran clean and doubles that
// wait (up to PaceMemory): the edge is found again within a request per
// PaceWindow, at the cost of a block rarer and rarer. A block at a rate
// that had run clean halves it.
const (
	PaceWindow = time.Second
	PaceMemory = 10 * time.Minute
	RaiseAfter = 5 * PaceWindow
	ProbeAfter = 30 * PaceWindow
)

// paceShare is the share, in tenths, of what passed (or of the ceiling)
// that a pace lets out.
const paceShare = 9

// every returns the interval of a pace of rate requests per PaceWindow,
// rounded up to the millisecond so that a window never holds one more.
func every(rate float64) time.Duration {
	return (time.Duration(float64(PaceWindow)/rate) + time.Millisecond - 1).Truncate(time.Millisecond)
}

// share returns the interval of a pace of paceShare tenths of rate.
func share(rate float64) time.Duration { return every(rate * paceShare / 10) }

// rate returns the requests per PaceWindow of a pace of one per d.
func rate(d time.Duration) float64 { return float64(PaceWindow) / float64(d) }

// slotWidth is the width of the slots in which passes are counted; slots
// is how many a ring keeps, more than PaceWindow holds.
const (
	slotWidth   = 100 * time.Millisecond
	slots       = 32
	windowSlots = int(PaceWindow / slotWidth) // the slots of a PaceWindow
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
	return s.sum(key, slotOf(t), windowSlots)
}

// sum returns the requests of key that passed in the k slots up to slot n.
func (s *passes) sum(key string, n uint32, k int) int {
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
	key   string        // its route, or All
	every time.Duration // one request per every
	next  time.Time     // the next may go then
	until time.Time     // forgotten then
	tried bool          // a request other than a block's probe went out under it

	// Probing upward: ceil is the rate the edge last refused, in requests
	// per PaceWindow; good is the pace before the last raise (0: none
	// since the block), set is when every was set, probeAfter how long it
	// must run clean before a raise past nine tenths of ceil, and held
	// whether it held a request back since.
	ceil       float64
	good       time.Duration
	set        time.Time
	probeAfter time.Duration
	held       bool

	// learned is the slot of the block that set the pace from what had
	// passed, to count again once the answers in flight at the block are
	// in (see recount); zero once counted again.
	learned uint32
}

// raise lets one request more per PaceWindow through p, when it ran clean
// for long enough while holding requests back: RaiseAfter within nine
// tenths of its ceiling, probeAfter past it; now is the time.
func (p *pace) raise(now time.Time) {
	if !p.held {
		return
	}
	next := rate(p.every) + 1
	wait := RaiseAfter
	if next*10 > paceShare*p.ceil {
		wait = p.probeAfter
	}
	if now.Sub(p.set) < wait {
		return
	}
	e := every(next)
	if e >= p.every {
		return
	}
	p.good, p.every, p.set, p.held = p.every, e, now, false
}

// learn sets, or lowers, the pace of key after a block this process met
// or heard of at now; g.mu is held.
func (g *Gates) learn(key string, now time.Time) {
	if _, ok := g.paces[key]; !ok && key != All && len(g.paces) >= maxPaces {
		key = All // bounded: blocks on that many routes are the IP's
	}
	n := g.passed.count(key, now)
	e, ceil, learned := share(float64(n)), float64(n), slotOf(now)
	p := g.paces[key]
	probeAfter := ProbeAfter
	if p != nil && now.Before(p.until) {
		if !p.tried {
			// Nothing went out under the pace yet: the same block.
			return
		}
		probeAfter, ceil, learned = p.probeAfter, rate(p.every), 0
		if p.good > p.every {
			// Blocked after a raise: back to the rate that ran clean,
			// and the next raise past the ceiling waits twice as long.
			e = p.good
			probeAfter = min(2*p.probeAfter, PaceMemory)
		} else if now.Sub(p.set) < RaiseAfter {
			// Blocked soon after the pace was set: what passed before
			// overstated the edge a little (a count is one off when the
			// network bunches answers); a tenth less.
			e = share(rate(p.every))
		} else {
			// Blocked at a rate that had run clean: the edge came down.
			e = min(2*p.every, max(g.max, PaceWindow, p.every))
		}
	} else if n == 0 {
		// Nothing of this process passed there yet. Its requests may
		// still be in flight (a burst at its start, met by the block
		// before any answer came): the pace waits for the recount, which
		// keeps it if any of them passed, and forgets it if none did, so
		// that a process that had sent nothing is not held back.
		ceil, e = 0, 0
	}
	if p == nil {
		p = &pace{key: key}
		g.paces[key] = p
	}
	p.every, p.until, p.tried, p.ceil, p.learned = e, now.Add(PaceMemory), false, ceil, learned
	p.good, p.set, p.probeAfter, p.held = 0, now, probeAfter, false
	if g.paceSweep.IsZero() || p.until.Before(g.paceSweep) {
		g.paceSweep = p.until
	}
	g.broadcast()
}

// lateAnswers is how many slots after a block the answers of requests
// sent before it are counted in (see recount): they come within a round
// trip, and the block's pause, at least a second, keeps any request sent
// after the block out of them.
const lateAnswers = 5

// recount counts again, for the pace p, the most that passed within a
// PaceWindow up to the block that set it, now that the answers in flight
// at the block are in, once the pace lets its first request out: a block
// can answer before requests sent just ahead of it, which passed and count
// towards the rate the edge allowed. A passing request is counted when its
// answer comes, so the windows counted end from the block's slot to
// lateAnswers slots after it. It only raises the pace; the ring must still
// hold the slots, as it does for a first pause of up to two seconds. g.mu
// is held.
func (g *Gates) recount(p *pace, now time.Time) {
	from, last := p.learned, slotOf(now)
	p.learned = 0
	n := 0.0
	if from != 0 && int(last-from)+windowSlots < slots {
		// The most that passed within a PaceWindow, over the windows that
		// end between the block and lateAnswers slots after it, less one:
		// answers the network bunched can put one more in a window than
		// the edge let through in one, and the most of several windows
		// finds it. The one less also keeps processes that pace
		// themselves apart under the edge together: each one's evenly
		// spaced requests can put one more than its rate in a window. At
		// least one request per window if any passed: a pace that had
		// nothing to learn from at the block (the only one a single pass
		// can raise) keeps it.
		most := 0
		for end := from; end <= from+lateAnswers; end++ {
			most = max(most, g.passed.sum(p.key, end, windowSlots))
		}
		n = float64(max(most-1, min(most, 1)))
	}
	if n > p.ceil {
		p.every, p.ceil = share(n), n
	}
	if p.ceil == 0 {
		// Nothing of this process passed before the block after all.
		g.forget(p)
	}
}

// forget drops the pace p; g.mu is held.
func (g *Gates) forget(p *pace) {
	if g.paces[p.key] == p {
		delete(g.paces, p.key)
		g.broadcast()
	}
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

// paceSlack returns how long a request the paces of route let out may
// still wait before it goes: a twentieth of the shortest of their
// intervals, half the share of it that the pace keeps back (see
// paceShare). A request that waited longer after the pace let it out, for
// a grant claimed again, gives its turn back and goes through the pace
// again (see Gates.pace).
func (g *Gates) paceSlack(route string) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	var d time.Duration
	for _, p := range g.paced(route, g.clk.Now()) {
		if p.every > 0 && (d == 0 || p.every < d) {
			d = p.every
		}
	}
	return d / 20
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
	return g.awaitTurn(ctx, c, probe, done, nil)
}

// A turn is what letting a claim out took from the paces of its route:
// how each pace's next turn moved. A claim that does not go after all (its
// grant lapsed, and the fresh one waited) gives its turn back and waits
// again in the place it had (seq).
type turn struct {
	seq  uint64
	took []took
}

type took struct {
	p             *pace
	before, after time.Time
}

// giveBack returns the turn t took to the paces that no other claim took
// a turn of since.
func (g *Gates) giveBack(t *turn) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range t.took {
		if k.p.next.Equal(k.after) {
			k.p.next = k.before
		}
	}
	t.took = t.took[:0]
	g.broadcast()
}

// awaitTurn is awaitPace that notes in t, when not nil, the turn it took,
// and waits in t's place in line when t has one.
func (g *Gates) awaitTurn(ctx context.Context, c store.Claim, probe bool, done <-chan struct{}, t *turn) error {
	start := g.clk.Now()
	maxWait := c.MaxWait
	g.mu.Lock()
	if len(g.paces) == 0 {
		g.mu.Unlock()
		return nil
	}
	var seq uint64
	var leave func()
	if t != nil && t.seq != 0 {
		seq, leave = g.rejoin(g.pacing, c.Route, t.seq)
	} else {
		seq, leave = g.join(g.pacing, c.Route)
	}
	if t != nil {
		t.seq = seq
	}
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
				if p.learned != 0 && !probe {
					g.recount(p, now)
				}
				if p.every == 0 {
					continue // forgotten: nothing passed before its block
				}
				p.raise(now)
				before := p.next
				p.next = later(p.next, now).Add(p.every)
				p.tried = p.tried || !probe
				if t != nil {
					t.took = append(t.took, took{p: p, before: before, after: p.next})
				}
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
