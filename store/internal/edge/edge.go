// Package edge holds Cloudflare blocks: 429s that Discord's API did not
// send (no rate-limit headers; see store.ScopeBlocked). Cloudflare counts
// per IP address, not per credential, so a block holds every request of its
// route from every credential of the store, and a ban page, or blocks on two
// routes, every request of the store.
//
// A block holds its requests for a pause, then lets one probe through. The
// probe's response decides: anything but another block ends the block and
// releases every waiter; another block waits the pause again, and each one
// after that doubles it, up to a cap (see Gates.pause). The
// probe is chosen among the waiters in arrival order. A request that was
// sent before the block and comes back blocked too extends the pause but
// does not double it: only the first block and each blocked probe count.
//
// A block also teaches a pace for its route, which holds its requests
// after their buckets grant them (see PaceWindow).
//
// Gates is the state of one store; both stores use it in front of their
// buckets. A [Remote] shares it between processes (the Redis store); a
// process then follows what the others learn.
package edge

import (
	"cmp"
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
)

// All is the key of the gate that holds every request of the store.
const All = "*"

// maxRoutes bounds the route gates: more blocked routes than this are held
// by the store-wide gate instead.
const maxRoutes = 1

// Lease bounds how long a probe may hold the others back without an
// answer.
const Lease = 15 * time.Second

// Remote shares the gates of a store between processes. Its methods are
// called without locks held; they report what the shared state became,
// which the caller merges. A failed call leaves the local state in charge.
type Remote interface {
	// Block records a block of key. strike reports a blocked probe, which
	// counts towards the doubling of the pause, as the first block of a
	// gate the shared store does not hold does; pause is the pause it
	// calls for; paced is the route its pace falls on (see State.Paced).
	Block(ctx context.Context, key string, strike bool, pause, first, max time.Duration, paced string) (State, error)
	// Probe asks for the probe of keys under id; the reply says whether it
	// was granted and, when not, the state of the gates that hold it.
	Probe(ctx context.Context, keys []string, id string) (bool, []State, error)
	// Pass ends the gates of keys that id probes.
	Pass(ctx context.Context, keys []string, id string) error
	// Release gives up the probe id holds on keys; penalty adds a pause of
	// first (the probe was sent but not answered).
	Release(ctx context.Context, keys []string, id string, penalty time.Duration) error
	// Shared tells the other processes that a 429 of scope shared holds
	// resource res (see Resource) for pause from now.
	Shared(ctx context.Context, res uint64, pause time.Duration) error
}

// State is one gate as the shared store reports it, times relative to the
// moment of the reply. Gone reports that the gate ended.
type State struct {
	Key     string
	Gone    bool
	Until   time.Duration // nothing goes before this
	Probe   time.Duration // a probe holds the gate this much longer
	Strikes int
	// Paced, when set, is the route that met the block in the process
	// that tells of it: for a gate of every route (All), the one to pace,
	// whose requests the edge counted.
	Paced string
}

type gate struct {
	until   time.Time
	probeTo time.Time          // a probe holds the gate until then
	probeID string             // the probe's id, shared with the remote
	prober  *store.Reservation // the probe's reservation, once bound
	strikes int
	changed time.Time // when this process last changed it

	// A block of every route does not say which route went past the
	// edge: paced is the route its pace fell on, sent when the request
	// that taught it was granted. A block response of the episode to a
	// request granted before that, on another route, moves the pace there
	// while it has let nothing out (the request sent first is the likelier
	// to have met the edge first).
	paced string
	sent  time.Time
}

// Gates is the block state of one store. The zero value is not usable;
// create one with [New].
type Gates struct {
	active atomic.Bool // a gate exists: the only thing the fast path reads

	mu      sync.Mutex
	clk     clock.Clock
	base    time.Duration
	max     time.Duration
	gates   map[string]*gate
	changed chan struct{}     // closed and replaced when a gate changes
	waiting map[uint64]string // arrival number -> route of the claims waiting
	seq     uint64
	ids     atomic.Uint64
	prefix  string // of probe ids, unique to the store
	remote  Remote
	rctx    context.Context
	timeout time.Duration
	closed  bool           // no more calls to the remote
	rwg     sync.WaitGroup // calls to the remote made in the background

	paces  map[string]*pace  // what blocks taught (see PaceWindow)
	blamed string            // the route paced after the last block of every route
	pacing map[uint64]string // arrival number -> route of the claims waiting for a pace
	passed passes            // what passed the edge lately
	slot   atomic.Uint32     // the slot (see slotWidth) of the latest claim's arrival
	// paceSweep is when the next pace runs out (zero: none).
	paceSweep time.Time

	// shared is what 429s of scope shared taught of each resource they
	// held (see Resource), by digest. sharedOn reports that it is not
	// empty.
	shared   map[uint64]*resource
	sharedOn atomic.Bool
	offset   time.Duration // added to the waits of shared 429s
}

// New returns the gates of a store that pauses first after a block, at most
// max after repeated ones. remote, when not nil, shares them; background
// calls to it run under ctx, each bounded by timeout, until Close.
func New(clk clock.Clock, first, max time.Duration, prefix string, remote Remote, ctx context.Context, timeout time.Duration) *Gates {
	return &Gates{
		clk: clk, base: first, max: max,
		gates:   make(map[string]*gate),
		changed: make(chan struct{}),
		waiting: make(map[uint64]string),
		paces:   make(map[string]*pace),
		pacing:  make(map[uint64]string),
		prefix:  prefix,
		remote:  remote, rctx: ctx, timeout: timeout,
	}
}

// Active reports whether a gate exists. It takes no lock.
func (g *Gates) Active() bool { return g.active.Load() }

// Ticket is what [Gates.Wait] let through: a probe (Keys set) or a request
// no gate held.
type Ticket struct {
	Keys []string
	ID   string
}

// Probe reports whether the ticket is a probe.
func (t Ticket) Probe() bool { return len(t.Keys) > 0 }

// pause returns the pause after strikes blocks: the first pause after the
// first block and after the first blocked probe, then twice the one
// before, up to the cap. The probes go at one, two, four, eight... first
// pauses after the block began: each waits as long again as the block has
// lasted.
func (g *Gates) pause(strikes int) time.Duration {
	p := g.base
	for i := 2; i < strikes && p < g.max; i++ {
		p *= 2
	}
	return min(p, g.max)
}

// keys returns the gates that hold a claim on route; g.mu is held.
func (g *Gates) keys(route string) []string {
	var ks []string
	if _, ok := g.gates[All]; ok {
		ks = append(ks, All)
	}
	if _, ok := g.gates[route]; ok {
		ks = append(ks, route)
	}
	return ks
}

// broadcast wakes every waiter; g.mu is held.
func (g *Gates) broadcast() {
	close(g.changed)
	g.changed = make(chan struct{})
	g.active.Store(len(g.gates) > 0 || len(g.paces) > 0)
}

// Wait holds a claim on route until no gate holds it, or until it may go
// as the probe of the gates that hold it. start is when the claim arrived.
// It fails like a store's Acquire: with a *store.WaitError of scope
// blocked, at once when the wait is known to exceed what the claim
// accepts.
func (g *Gates) Wait(ctx context.Context, c *store.Claim, start time.Time, done <-chan struct{}) (Ticket, error) {
	var expired <-chan time.Time
	g.mu.Lock()
	seq, leave := g.join(g.waiting, c.Route)
	defer leave() // the next in line may probe
	for {
		now := g.clk.Now()
		ks := g.keys(c.Route)
		if len(ks) == 0 {
			g.mu.Unlock()
			return Ticket{}, nil
		}
		var until, held time.Time
		for _, k := range ks {
			gt := g.gates[k]
			until = later(until, gt.until)
			if now.Before(gt.probeTo) {
				held = later(held, gt.probeTo)
			}
		}
		open := !now.Before(until) && held.IsZero()
		if open && g.earliest(seq, c.Route) {
			id := g.prefix + ":" + uitoa(g.ids.Add(1))
			for _, k := range ks {
				gt := g.gates[k]
				gt.probeTo, gt.probeID, gt.prober = now.Add(Lease), id, nil
			}
			g.broadcast()
			ch := g.changed
			g.mu.Unlock()
			if g.remote == nil {
				return Ticket{Keys: ks, ID: id}, nil
			}
			ok, states, err := g.remote.Probe(ctx, ks, id)
			if err != nil || ok {
				return Ticket{Keys: ks, ID: id}, nil // a failed call leaves the local gate in charge
			}
			g.mu.Lock()
			for _, k := range ks {
				// Another process probes, or the pause grew: give up the
				// local mark and follow the shared store.
				if gt := g.gates[k]; gt != nil && gt.probeID == id {
					gt.probeTo, gt.probeID, gt.prober = time.Time{}, "", nil
				}
			}
			g.merge(states, now)
			if g.changed == ch {
				g.broadcast()
			}
			continue
		}
		wait := until.Sub(now)
		if !held.IsZero() {
			wait = max(wait, held.Sub(now))
		}
		ch := g.changed
		g.mu.Unlock()
		if c.NoWait {
			return Ticket{}, &store.WaitError{Scope: store.ScopeBlocked, RetryAfter: max(wait, 0), Err: store.ErrWaitTooLong}
		}
		if err := store.CheckWait(ctx, c, start, max(wait, 0)); err != nil {
			return Ticket{}, &store.WaitError{Scope: store.ScopeBlocked, RetryAfter: max(wait, 0), Err: err}
		}
		if expired == nil && c.MaxWait > 0 {
			t := g.clk.NewTimer(max(c.MaxWait-g.clk.Now().Sub(start), 0))
			defer t.Stop()
			expired = t.C()
		}
		var d time.Duration
		if !open {
			// Open means an earlier claim is about to probe: its taking
			// the probe wakes this one.
			d = max(wait, time.Millisecond)
		}
		if err := g.sleep(ctx, c, done, ch, d, expired); err != nil {
			return Ticket{}, &store.WaitError{Scope: store.ScopeBlocked, RetryAfter: g.Estimate(c.Route), Err: err}
		}
		g.mu.Lock()
	}
}

// sleep waits for a change of the gates (ch), for d when positive, and
// returns nil, or returns why the claim c waits no longer: its context
// ended, it or the store (done) was closed, or its maximum wait expired.
func (g *Gates) sleep(ctx context.Context, c *store.Claim, done, ch <-chan struct{}, d time.Duration, expired <-chan time.Time) error {
	var tc <-chan time.Time
	if d > 0 {
		t := g.clk.NewTimer(d)
		defer t.Stop()
		tc = t.C()
	}
	select {
	case <-ch:
	case <-tc:
	case <-ctx.Done():
		return ctx.Err()
	case <-c.Done:
		return store.ErrClosed
	case <-done:
		return store.ErrClosed
	case <-expired:
		return store.ErrWaitTooLong
	}
	return nil
}

// join puts a claim on route in line, waiting or pacing, under a new
// arrival number; leave takes it out and wakes the others. g.mu is held
// for join, not for leave.
func (g *Gates) join(line map[uint64]string, route string) (seq uint64, leave func()) {
	g.seq++
	return g.rejoin(line, route, g.seq)
}

// rejoin puts a claim on route back in line under the arrival number seq
// it had; see join.
func (g *Gates) rejoin(line map[uint64]string, route string, seq uint64) (uint64, func()) {
	line[seq] = route
	return seq, func() {
		g.mu.Lock()
		delete(line, seq)
		g.broadcast()
		g.mu.Unlock()
	}
}

// earliest reports whether seq is the earliest claim waiting on route;
// g.mu is held.
func (g *Gates) earliest(seq uint64, route string) bool {
	for s, r := range g.waiting {
		if s < seq && r == route {
			return false
		}
	}
	return true
}

// Holds reports whether a gate now holds a claim on route that t let
// through: a block arrived while the claim waited for its bucket. The
// store then gives the slot back and waits at the gates again, so no
// request granted before a block goes out after it.
func (g *Gates) Holds(t Ticket, route string) bool {
	if !g.Active() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range g.keys(route) {
		if gt := g.gates[k]; !t.Probe() || gt.probeID != t.ID {
			return true
		}
	}
	return false
}

// Holding reports whether a gate now holds the request of reservation r:
// a block arrived after r was granted, and r is not the gate's probe.
func (g *Gates) Holding(r *store.Reservation) bool {
	if !g.Active() {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range g.keys(r.Claim.Route) {
		if g.gates[k].prober != r {
			return true
		}
	}
	return false
}

// Estimate returns how long a claim on route is held at least.
func (g *Gates) Estimate(route string) time.Duration {
	if !g.Active() {
		return 0
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	now := g.clk.Now()
	var at time.Time
	for _, k := range g.keys(route) {
		at = later(at, g.gates[k].until)
	}
	for _, p := range g.paced(route, now) {
		at = later(at, p.next)
	}
	return max(at.Sub(now), 0)
}

// Bind names the reservation of a probe, so that its report ends, extends
// or releases the gates it probes.
func (g *Gates) Bind(t Ticket, r *store.Reservation) {
	if !t.Probe() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, k := range t.Keys {
		if gt := g.gates[k]; gt != nil && gt.probeID == t.ID {
			gt.prober = r
		}
	}
}

// Acquire holds claim c at the gates, then takes its slot with acquire,
// the store's own claim; a block that came while the claim waited for its
// slot sends it back to the gates, the slot given back. A claim that waited
// at the gates has its maximum wait shortened by that wait, and its
// reservation's Waited counts from start. done is the store's close
// signal.
func (g *Gates) Acquire(ctx context.Context, c store.Claim, start time.Time, done <-chan struct{},
	acquire func(store.Claim) (*store.Reservation, error)) (*store.Reservation, error) {
	maxWait := c.MaxWait
	gated := false
	if n := slotOf(start); g.slot.Load() != n {
		g.slot.Store(n)
	}
	var res uint64 // the claim's resource, named once a shared 429 holds any
	for {
		var place *mark // the claim's place among its resource's requests in flight
		if g.sharedOn.Load() {
			gated = true
			if res == 0 {
				res = Resource(&c)
			}
			var err error
			if place, err = g.awaitResource(ctx, &c, res, start, done); err != nil {
				return nil, err
			}
		}
		var tk Ticket
		if g.Active() {
			gated = true
			var err error
			if tk, err = g.Wait(ctx, &c, start, done); err != nil {
				g.dropResource(res, place)
				return nil, err
			}
		}
		if gated && maxWait > 0 {
			c.MaxWait = max(maxWait-g.clk.Now().Sub(start), 1)
		}
		r, err := acquire(c)
		if err != nil {
			g.Abandon(tk)
			g.dropResource(res, place)
			return nil, err
		}
		if g.Active() {
			if r, err = g.pace(ctx, c, maxWait, start, tk, r, done, acquire); err != nil {
				g.Abandon(tk)
				g.dropResource(res, place)
				return nil, err
			}
		}
		held := g.Holds(tk, c.Route)
		if !held && g.sharedOn.Load() {
			if res == 0 {
				res = Resource(&c)
			}
			if held = !g.takeResource(res, place, r); held {
				g.Abandon(tk) // the next in line probes
			}
		} else if held {
			g.dropResource(res, place)
		}
		if held {
			// A block came while the claim waited for its bucket, or a
			// shared 429 for its resource: give the slot back and wait
			// at the gates.
			gated = true
			r.Recycle()
			continue
		}
		g.Bind(tk, r)
		if gated {
			r.Waited = g.clk.Now().Sub(start)
		}
		return r, nil
	}
}

// pace holds r, the grant of claim c, until the paces of its route let it
// go (see awaitPace). A grant the pace outlasted (see
// store.Reservation.SendBy) is given back and claimed again; when that
// claim had to wait, the request gives back its turn (unless another
// request took the next) and goes through the pace again, in the place it
// had in line: requests let out by the pace and then held by their bucket
// would go together at the bucket's reset, however far apart the pace let
// them out. r is recycled when pace fails.
func (g *Gates) pace(ctx context.Context, c store.Claim, maxWait time.Duration, start time.Time, tk Ticket,
	r *store.Reservation, done <-chan struct{}, acquire func(store.Claim) (*store.Reservation, error)) (*store.Reservation, error) {
	// left is c with what remains of its maximum wait.
	left := func() store.Claim {
		lc := c
		if maxWait > 0 {
			lc.MaxWait = max(maxWait-g.clk.Now().Sub(start), 1)
		}
		return lc
	}
	var t turn
	for {
		if err := g.awaitTurn(ctx, left(), tk.Probe(), done, &t); err != nil {
			r.Recycle()
			return nil, err
		}
		if !r.Lapsed() {
			return r, nil
		}
		r.Recycle()
		let := g.clk.Now()
		var err error
		if r, err = acquire(left()); err != nil {
			return nil, err
		}
		if g.clk.Now().Sub(let) <= g.paceSlack(c.Route) {
			return r, nil
		}
		g.giveBack(&t)
	}
}

// Abandon gives up the probe of a ticket whose request will not be sent.
func (g *Gates) Abandon(t Ticket) {
	if !t.Probe() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.release(t.Keys, t.ID, 0)
}

// release ends the probe id holds on keys; g.mu is held.
func (g *Gates) release(keys []string, id string, penalty time.Duration) {
	now := g.clk.Now()
	for _, k := range keys {
		if gt := g.gates[k]; gt != nil && gt.probeID == id {
			gt.probeTo, gt.probeID, gt.prober = time.Time{}, "", nil
			if penalty > 0 {
				gt.until = later(gt.until, now.Add(penalty))
			}
		}
	}
	g.broadcast()
	g.background(func(ctx context.Context) { _ = g.remote.Release(ctx, keys, id, penalty) })
}

// Settle applies what a request of claim c taught, reported through r.
//
// A 429 of scope shared holds the claim's resource (see Resource) for the
// wait it names; u's RetryAfter is then set to zero, so that the store
// leaves the bucket's counts and pauses alone. A request of a resource
// that such a 429 held is out no more (see Gates.takeResource).
func (g *Gates) Settle(r *store.Reservation, c *store.Claim, u *store.Update) {
	on := g.sharedOn.Load()
	shared := u.Sent && u.Status == 429 && u.Scope == store.ScopeShared
	if on || shared {
		// The resource is held before the request leaves its requests in
		// flight: a claim woken by the leaving must find it held.
		res := Resource(c)
		if shared && g.settleShared(res, u) {
			u.RetryAfter = 0
		}
		g.settleResource(res, r, u)
	}
	blocked := u.Sent && u.Status == 429 && u.Scope == store.ScopeBlocked
	if u.Sent && u.Status > 0 && !blocked {
		// It passed the edge. Counted in the slot of the latest claim's
		// arrival: a slot is 100 ms wide, and reading the clock for each
		// response would cost more than the count.
		g.passed.add(c.Route, g.slot.Load())
	}
	if !blocked && !g.Active() {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var probed []string
	var id string
	for k, gt := range g.gates {
		if gt.prober == r && r != nil {
			probed, id = append(probed, k), gt.probeID
		}
	}
	switch {
	case blocked:
		g.block(r, c.Route, u, probed, id)
	case len(probed) == 0:
	case !u.Sent:
		g.release(probed, id, 0)
	case u.Status == 0:
		// Sent, no answer: it may have met the block; wait before the next.
		g.release(probed, id, g.base)
	default:
		for _, k := range probed {
			delete(g.gates, k)
		}
		g.broadcast()
		g.background(func(ctx context.Context) { _ = g.remote.Pass(ctx, probed, id) })
	}
}

// blame names route as the one that went past the edge in a block of
// every route. The pace a block of every route set on another route before
// was set there by mistake (the edge met on one route is met on it again):
// it goes. g.mu is held.
func (g *Gates) blame(route string) {
	if g.blamed != "" && g.blamed != route {
		delete(g.paces, g.blamed)
	}
	g.blamed = route
}

// block applies a block of route to the request of r; probed are the
// gates the request probed (under id). g.mu is held.
func (g *Gates) block(r *store.Reservation, route string, u *store.Update, probed []string, id string) {
	var sent time.Time // when the request was granted, if the store says
	if r != nil && !r.SendBy.IsZero() {
		sent = r.SendBy
	}
	key := route
	if u.Ban {
		key = All
	} else if _, ok := g.gates[route]; !ok && g.routes() >= maxRoutes {
		key = All // blocks on several routes: the IP is what is blocked
	}
	now := g.clk.Now()
	gt := g.gates[key]
	fresh, probeBlocked := gt == nil, false
	if fresh {
		gt = &gate{}
		g.gates[key] = gt
	}
	for _, k := range probed {
		probeBlocked = probeBlocked || k == key
		if p := g.gates[k]; p != nil && p.probeID == id {
			p.probeTo, p.probeID, p.prober = time.Time{}, "", nil
		}
	}
	strike := fresh || probeBlocked
	if strike {
		gt.strikes++
		// The pace falls on the route that went past the limit, even when
		// the block holds every route (a body that is not JSON, a ban
		// page): its requests are what the edge counted; blocks on several
		// routes pace the store.
		paced := key
		if u.Ban && route != "" {
			paced = route
			g.blame(paced)
		}
		g.learn(paced, now)
		gt.paced, gt.sent = paced, sent
	} else if u.Ban && route != "" && route != gt.paced && !sent.IsZero() && sent.Before(gt.sent) {
		if p := g.paces[gt.paced]; p == nil || !p.tried {
			g.blame(route) // lifts the pace of gt.paced
			g.learn(route, now)
			gt.paced, gt.sent = route, sent
		}
	}
	pause := max(g.pause(max(gt.strikes, 1)), u.RetryAfter)
	gt.until = later(gt.until, now.Add(pause))
	gt.changed = now
	g.broadcast()
	paced := gt.paced
	g.background(func(ctx context.Context) {
		// Only a blocked probe is a strike for the shared store, which
		// counts one for a gate it did not have: the first block of an
		// episode, met by several processes, is one strike.
		st, err := g.remote.Block(ctx, key, probeBlocked, pause, g.base, g.max, paced)
		if err == nil {
			g.mu.Lock()
			g.merge([]State{st}, g.clk.Now())
			g.broadcast()
			g.mu.Unlock()
		}
	})
}

// Merge applies states that other processes made; now is when they were
// read.
func (g *Gates) Merge(states []State, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.merge(states, now)
	g.broadcast()
}

// Replace makes the gates exactly states (a full read of the shared
// store); now is when they were read.
func (g *Gates) Replace(states []State, now time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	seen := make(map[string]bool, len(states))
	for _, st := range states {
		seen[st.Key] = true
	}
	for k, gt := range g.gates {
		// A gate this process changed lately may not have reached the
		// shared store yet: a probe finds out whether it still holds.
		if !seen[k] && gt.probeID == "" && gt.changed.Before(now.Add(-g.timeout)) {
			delete(g.gates, k)
		}
	}
	g.merge(states, now)
	g.broadcast()
}

// merge applies shared states; g.mu is held. The shared store's word wins
// for the pause and the strikes; a probe of this process keeps its lease
// until the shared store names another.
func (g *Gates) merge(states []State, now time.Time) {
	for _, st := range states {
		if st.Key == "" {
			continue
		}
		gt := g.gates[st.Key]
		if st.Gone {
			if gt != nil {
				delete(g.gates, st.Key)
			}
			continue
		}
		if gt == nil && st.Key != All && g.routes() >= maxRoutes {
			st.Key = All // bounded whatever the shared store holds
			gt = g.gates[All]
		}
		if gt == nil {
			gt = &gate{paced: st.Key}
			if st.Key == All && st.Paced != "" {
				gt.paced = st.Paced
				g.blame(st.Paced)
			}
			g.gates[st.Key] = gt
			g.learn(gt.paced, now) // another process met a block
		} else if st.Strikes > max(gt.strikes, 1) {
			// Another process's probe was blocked. The first block is
			// one strike: a gate made from a note sent before the shared
			// store held it (no strike yet) learns nothing again from the
			// note that follows.
			g.learn(cmp.Or(gt.paced, st.Key), now)
		}
		// A pause only grows until a probe passes (Gone).
		gt.until = later(gt.until, now.Add(st.Until))
		gt.strikes = max(gt.strikes, st.Strikes)
		if st.Probe > 0 && gt.probeID == "" {
			gt.probeTo = now.Add(st.Probe)
		} else if st.Probe <= 0 && gt.probeID == "" {
			gt.probeTo = time.Time{}
		}
	}
}

// routes counts the route gates; g.mu is held.
func (g *Gates) routes() int {
	n := len(g.gates)
	if _, ok := g.gates[All]; ok {
		n--
	}
	return n
}

// Close stops calling the remote and waits for the calls under way.
func (g *Gates) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.rwg.Wait()
}

// background runs f against the remote, if any, bounded by the timeout;
// g.mu is held.
func (g *Gates) background(f func(ctx context.Context)) {
	if g.remote == nil || g.closed || g.rctx == nil || g.rctx.Err() != nil {
		return
	}
	g.rwg.Add(1)
	go func() {
		defer g.rwg.Done()
		ctx, cancel := context.WithTimeout(g.rctx, g.timeout)
		defer cancel()
		f(ctx)
	}()
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func uitoa(n uint64) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			break
		}
	}
	return string(b[i:])
}
