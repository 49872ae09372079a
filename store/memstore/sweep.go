package memstore

import (
	"slices"
)

// Idle state is collected by sweeps. A sweep drops the buckets whose
// windows have reset and that nobody uses, the routes unused for routeTTL,
// expired cooldowns, and the credentials left with nothing. It runs when
// the store has grown by half since the last one, and at least every
// sweepEvery (idleAfter while the store holds more routes than it keeps
// idle, see below): on a request, or by a timer while the store holds
// state and no request comes.
//
// Beyond that, the store keeps at most maxEntries credentials and routes
// (folded credentials count too, foldShare for one): a sweep that finds
// more drops the least recently used routes, down to three quarters of the
// bound. Of the routes unused for idleAfter it keeps the most recently used
// maxEntries/idleShare: a burst of many credentials is forgotten within
// seconds of its end, while the routes of a bot with few credentials stay
// known for routeTTL. A forgotten route is as one never seen: its next
// request probes its bucket again, one request at a time until the
// response names it. A credential left without routes is folded into a
// record of 8 bytes (see fold.go) as soon as nothing of it is in flight or
// waiting: its buckets go, and the requests that still count in its global
// window and the reset of a bucket with no slot left are kept. No sweep
// drops what the limits still need: a bucket with requests in flight or
// waiting, or a pause; a credential with any of those, a pause, a cooldown,
// or a hidden sublimit. Such state is kept even beyond the bound (the store
// then grows, and sweeps come further apart, at most one per half of the
// store added) and collected once it is idle.

const (
	// minSweep is the size below which no size-triggered sweep runs.
	minSweep = 1024
	// sweepEvery bounds the time between sweeps (ms).
	sweepEvery = 60_000
	// routeTTL is how long a learned route -> bucket mapping outlives its
	// last use (ms), as in the Redis store.
	routeTTL = 3_600_000
	// DefaultMaxEntries is how many credentials and routes a Store keeps
	// unless told otherwise: a few tens of megabytes at most.
	DefaultMaxEntries = 1 << 15
	// idleAfter is how long a route is unused before it counts against the
	// share of the bound kept idle (ms).
	idleAfter = 10_000
	// idleShare divides the bound into the routes kept idle.
	idleShare = 32
	// foldShare is how many folded windows (see fold.go) count as one
	// credential or route against the bound: about the ratio of their
	// sizes.
	foldShare = 16
)

// size is what the size trigger counts: buckets, routes and credentials.
func (s *Store) size() int { return s.nbuckets + s.nroutes + len(s.creds) }

// maybeSweep sweeps when the store has grown enough since the last sweep,
// or every() has passed.
func (s *Store) maybeSweep(now int64) {
	if s.size() < s.sweepAt && now-s.lastSweep < s.every() {
		return
	}
	s.sweep(now)
}

// sweep collects idle state (see above) and schedules the next sweep.
func (s *Store) sweep(now int64) {
	s.lastSweep = now
	s.sweeps++
	s.credsPeak = max(s.credsPeak, len(s.creds))
	for id, cr := range s.creds {
		s.sweepCred(cr, now)
		if cr.empty(now) {
			delete(s.creds, id)
		} else if len(cr.routes) == 0 {
			s.fold(cr, now)
		}
	}
	s.sweepFolds(now)
	s.evict(now)
	s.credsPeak = shrink(&s.creds, s.credsPeak)
	// The next sweep when the store reaches the bound, or when it has
	// grown by half if it is beyond the bound (holding state it must keep):
	// the cost of sweeps stays proportional to the requests that grow the
	// store. Never sooner than minSweep/4 additions.
	n := s.size()
	next := n + max(n/2, minSweep/4)
	if bound := s.maxEntries + s.nbuckets - len(s.folds)/foldShare; bound > n {
		next = min(next, max(bound, n+minSweep/4))
	}
	s.sweepAt = next
	s.armSweep(now)
}

// sweepCred drops cr's idle buckets, stale routes and expired cooldowns.
func (s *Store) sweepCred(cr *cred, now int64) {
	cr.bucketsPeak = max(cr.bucketsPeak, len(cr.buckets))
	cr.routesPeak = max(cr.routesPeak, len(cr.routes))
	for k, b := range cr.buckets {
		if b.idle(now) {
			b.removed = true
			delete(cr.buckets, k)
			s.nbuckets--
		}
	}
	for name, r := range cr.routes {
		if now-r.seen > routeTTL {
			delete(cr.routes, name)
			s.nroutes--
		} else if r.last != nil && r.last.removed {
			r.last = nil // let the swept bucket go
		}
	}
	for m, until := range cr.dead {
		if now >= until {
			delete(cr.dead, m)
		}
	}
	cr.sweepSubs(now)
	cr.bucketsPeak = shrink(&cr.buckets, cr.bucketsPeak)
	cr.routesPeak = shrink(&cr.routes, cr.routesPeak)
}

func (b *bucket) idle(now int64) bool {
	return b.q.empty() && !b.alarm.armed() && b.Idle(now)
}

// empty reports whether cr holds nothing worth keeping at now.
func (cr *cred) empty(now int64) bool {
	return len(cr.buckets) == 0 && len(cr.routes) == 0 && len(cr.dead) == 0 && len(cr.subs) == 0 && cr.idle(now)
}

// idle reports whether cr's own state (not its buckets and routes) may be
// forgotten at now.
func (cr *cred) idle(now int64) bool {
	if !cr.globalQ.empty() || cr.alarm.armed() || now < cr.m.Pause || now < cr.m.Unauthorized {
		return false
	}
	return cr.global.empty(now)
}

// every returns the longest time between two sweeps (ms): idleAfter while
// the store holds more routes than it keeps idle, so that they go within
// two idleAfter of their last use, else sweepEvery.
func (s *Store) every() int64 {
	if s.nroutes > s.idleMax() {
		return idleAfter
	}
	return sweepEvery
}

// idleMax is how many of the routes unused for idleAfter the store keeps.
func (s *Store) idleMax() int { return max(s.maxEntries/idleShare, 1) }

// evict drops the least recently used routes (a few more when several
// were last used in the same millisecond) when the store holds more than
// the bound, or more idle routes than it keeps, and folds or drops the
// credentials left without routes.
func (s *Store) evict(now int64) {
	over := s.nroutes + len(s.creds) + len(s.folds)/foldShare - s.maxEntries
	if over <= 0 && s.nroutes <= s.idleMax() {
		return
	}
	seen := make([]int64, 0, s.nroutes)
	idle := 0
	for _, cr := range s.creds {
		for _, r := range cr.routes {
			seen = append(seen, r.seen)
			if now-r.seen >= idleAfter {
				idle++
			}
		}
	}
	n := idle - s.idleMax()
	if over > 0 {
		n = max(n, over+s.maxEntries/4)
	}
	if n = min(n, len(seen)); n <= 0 {
		return
	}
	slices.Sort(seen)
	cut := seen[n-1]
	for id, cr := range s.creds {
		for name, r := range cr.routes {
			if r.seen <= cut {
				delete(cr.routes, name)
				s.nroutes--
			}
		}
		cr.routesPeak = shrink(&cr.routes, cr.routesPeak)
		if cr.empty(now) {
			delete(s.creds, id)
		} else if len(cr.routes) == 0 {
			s.fold(cr, now)
		}
	}
}

// shrink replaces *m with a copy when it holds less than a quarter of what
// it held at its peak: a Go map keeps the room of its largest size. It
// returns the new peak.
func shrink[K comparable, V any](m *map[K]V, peak int) int {
	n := len(*m)
	if peak < 64 || n > peak/4 {
		return max(peak, n)
	}
	c := make(map[K]V, n)
	for k, v := range *m {
		c[k] = v
	}
	*m = c
	return n
}

// armSweep makes sure a sweep runs within every() of the last one while
// the store holds state, even when no request comes to trigger one.
func (s *Store) armSweep(now int64) {
	if s.closed || len(s.creds)+len(s.folds) == 0 {
		return
	}
	s.wake(&s.sweeper, now, max(s.lastSweep+s.every(), now+1), func() {
		if s.closed {
			return
		}
		if now := s.now(); now-s.lastSweep >= s.every() {
			s.sweep(now)
		} else {
			s.armSweep(now)
		}
	})
}
