// Package memstore keeps ratecord's rate-limit state in the memory of one
// process. It is the store a Transport uses when it is given none.
//
// Waiters queue per bucket in arrival order and are handed their slot
// directly when it opens: no waiter polls, and no more waiters wake than there
// are slots. Requests that pass their bucket and count against the global
// limit then queue, in arrival order again, for the credential's global
// window.
//
// Idle state is swept as the store grows, so memory stays bounded however
// many distinct routes pass (every interaction token makes a new one).
package memstore

import (
	"context"
	"sync"
	"time"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
)

// Store is an in-memory [store.Store]. The zero value is not usable; create
// one with [New]. It is safe for concurrent use.
type Store struct {
	mu        sync.Mutex // guards every field below and all state reachable from creds
	clock     clock.Clock
	creds     map[string]*cred
	invalid   invalidLog
	seq       uint64
	closed    bool
	done      chan struct{}
	nbuckets  int
	sweepAt   int
	lastSweep time.Time
}

var _ store.Store = (*Store)(nil)

// Option configures a Store.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// withClock injects the clock; tests in this package use it.
func withClock(c clock.Clock) Option {
	return optionFunc(func(s *Store) {
		if c != nil {
			s.clock = c
		}
	})
}

// New returns an empty Store. It starts no goroutine: timers run only while
// requests wait.
func New(opts ...Option) *Store {
	s := &Store{
		clock:   clock.Real{},
		creds:   make(map[string]*cred),
		done:    make(chan struct{}),
		sweepAt: minSweep,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(s)
		}
	}
	s.lastSweep = s.clock.Now()
	s.invalid.epoch = s.lastSweep
	s.invalid.sumIdx = -1
	return s
}

const (
	// minSweep is the bucket count below which no size-triggered sweep runs.
	minSweep = 1024
	// sweepEvery bounds the time between sweeps.
	sweepEvery = time.Minute
	// routeTTL is how long a learned route -> bucket mapping outlives its
	// last use.
	routeTTL = time.Hour
)

// cred is the state of one credential.
type cred struct {
	id         string
	routes     map[string]*route
	buckets    map[bkey]*bucket
	global     ring
	globalQ    queue // waiters that hold their bucket slot and wait for the global window
	pauseUntil time.Time
	blocked    time.Time // a Cloudflare block: every bucket of the credential pauses
	deadUntil  time.Time
	dead       map[string]time.Time // token-authenticated majors that answered 401 or 404
	probes     map[string]int       // requests in flight on routes whose bucket is unknown, by major
	alarm      alarm                // pumps the global queue when its window opens
	lastUsed   time.Time
}

// route is what was learned about a route template.
type route struct {
	hash string // learned bucket hash; "" while unknown
	none bool   // the route answers without rate-limit headers
	seen time.Time
	last *bucket // the bucket this route resolved to last, to skip a lookup
}

// bkey names a counter. Learned buckets have hash set and route empty; the
// probe bucket of a route whose hash is not known yet has route set.
type bkey struct {
	hash, route, major string
}

// bucket is one counter: (credential, hash, major parameter).
type bucket struct {
	key bkey
	c   *cred

	known     bool // limit, remaining and window come from headers
	limit     int
	remaining int
	resetAt   time.Time // zero: the window has not started
	estimated bool      // resetAt is an estimate, replaced by the next response
	window    time.Duration
	span      time.Duration // shortest time a window has been seen to last: a lower bound for estimates
	offset    time.Duration // the updates' safety margin

	// A sliding window (a leaky bucket) gives its slots back one at a time.
	// Headers do not say which kind a bucket is; it shows when the moment
	// the bucket will be full again moves later with each request inside
	// one window, which a fixed window never does.
	sliding       bool
	evidence      int           // consecutive observations that looked sliding
	instant       time.Time     // when the last response said the bucket would be full
	seenAt        time.Time     // when that response arrived
	seenRemaining int           // and the Remaining it gave
	level         float64       // the leaky-bucket model: requests counted at levelAt,
	levelAt       time.Time     // draining one per tauHi
	tauLo         time.Duration // bounds of the time one slot takes to drain,
	tauHi         time.Duration // from Reset-After = level * tau and Remaining = floor(limit - level)
	pauseUntil    time.Time
	pending       int // granted requests whose response has not been reported
	retired       bool
	removed       bool // swept: no longer in the credential's map
	unlimited     bool // routes without a bucket: only pauses apply

	q        queue
	alarm    alarm // pumps the bucket when time alone may open it
	lastUsed time.Time
}

type waiter struct {
	seq    uint64
	route  string
	major  string
	global bool
	offset time.Duration
	b      *bucket // the bucket the waiter queues on or was granted from
	stage  int     // stageBucket, stageGlobal or stageGranted
	token  uint64  // the global window's token, once granted
	ready  chan struct{}
}

const (
	stageBucket = iota
	stageGlobal
	stageGranted
	stageGone
)

// Acquire implements [store.Store].
func (s *Store) Acquire(ctx context.Context, claim store.Claim) (store.Permit, error) {
	c := &claim
	if err := ctx.Err(); err != nil {
		return store.Permit{}, &store.WaitError{Err: err}
	}
	select {
	case <-c.Done:
		return store.Permit{}, &store.WaitError{Err: store.ErrClosed}
	default:
	}
	now := s.clock.Now()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return store.Permit{}, &store.WaitError{Err: store.ErrClosed}
	}
	s.maybeSweep(now)
	cr := s.cred(c.Credential, now)
	if err := s.refuse(cr, c, now); err != nil {
		s.mu.Unlock()
		return store.Permit{}, err
	}
	b := s.resolve(cr, c.Route, c.Major, now)
	if c.Global {
		cr.global.resize(globalLimit(c))
		cr.global.window = globalWindow(c)
	}
	if (b == nil || b.q.empty() && b.available(now)) && (!c.Global || cr.globalQ.empty() && cr.globalReady(now, globalWindow(c))) {
		p := s.grant(cr, b, c, now)
		s.mu.Unlock()
		return p, nil
	}

	if wait := s.estimate(cr, b, c, now); wait > 0 {
		if err := store.CheckWait(ctx, c, now, wait); err != nil {
			scope := store.ScopeUser
			if b == nil || (c.Global && b.q.empty() && b.available(now)) {
				scope = store.ScopeGlobal
			}
			s.mu.Unlock()
			return store.Permit{}, &store.WaitError{Bucket: hashOf(b), Scope: scope, RetryAfter: wait, Err: err}
		}
	}
	s.seq++
	w := &waiter{seq: s.seq, route: c.Route, major: c.Major, global: c.Global, offset: store.ClampDuration(c.Offset), b: b, ready: make(chan struct{})}
	if b != nil {
		b.q.push(w)
		s.pumpBucket(b, now)
	} else {
		w.stage = stageGlobal
		cr.globalQ.push(w)
		s.pumpGlobal(cr, now, globalWindow(c))
	}
	s.mu.Unlock()
	return s.wait(ctx, c, cr, w, now)
}

// wait blocks until w is granted or gives up.
func (s *Store) wait(ctx context.Context, c *store.Claim, cr *cred, w *waiter, start time.Time) (store.Permit, error) {
	var expired <-chan time.Time
	if c.MaxWait > 0 {
		t := s.clock.NewTimer(c.MaxWait)
		defer t.Stop()
		expired = t.C()
	}
	var err error
	select {
	case <-w.ready:
		now := s.clock.Now()
		return store.Permit{Bucket: hashOf(w.b), Waited: now.Sub(start), Handle: handle(w.b), Token: w.token}, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.Done:
		err = store.ErrClosed
	case <-s.done:
		err = store.ErrClosed
	case <-expired:
		err = store.ErrWaitTooLong
	}

	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	scope := store.ScopeUser
	if w.stage == stageGlobal {
		scope = store.ScopeGlobal
	}
	if w.b != nil && now.Before(w.b.pauseUntil) {
		scope = store.ScopeShared
	}
	werr := &store.WaitError{Bucket: hashOf(w.b), Scope: scope, Err: err}
	if !s.closed {
		werr.RetryAfter = s.estimate(cr, w.b, c, now)
	}
	s.abandon(cr, w, now, globalWindow(c))
	return store.Permit{}, werr
}

// abandon takes w out of line and gives back what it holds.
func (s *Store) abandon(cr *cred, w *waiter, now time.Time, window time.Duration) {
	switch w.stage {
	case stageBucket:
		w.b.q.remove(w)
	case stageGlobal:
		cr.globalQ.remove(w)
		if w.b != nil {
			w.b.giveBack()
		}
	case stageGranted:
		if w.b != nil {
			w.b.giveBack()
		}
		if w.global {
			cr.global.remove(w.token)
		}
	}
	w.stage = stageGone
	if s.closed {
		return
	}
	if w.b != nil {
		s.pumpBucket(w.b, now)
	}
	s.pumpGlobal(cr, now, window)
}

// grant takes a slot from b (if any) and from the global window (if global)
// and returns the permit.
func (s *Store) grant(cr *cred, b *bucket, c *store.Claim, now time.Time) store.Permit {
	if b != nil {
		b.take(now)
	}
	p := store.Permit{Bucket: hashOf(b), Handle: handle(b)}
	if c.Global {
		p.Token = cr.global.push(now.Add(store.ClampDuration(c.Offset)))
	}
	return p
}

func handle(b *bucket) any {
	if b == nil {
		return nil
	}
	return b
}

func hashOf(b *bucket) string {
	if b == nil {
		return ""
	}
	return b.key.hash
}

// refuse applies the invalid-request guard and the 401/404 cooldowns.
func (s *Store) refuse(cr *cred, c *store.Claim, now time.Time) error {
	if budget := invalidBudget(c); budget > 0 {
		if n, free := s.invalid.count(now); n >= budget {
			return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: free.Sub(now), Err: store.ErrInvalidBudget}
		}
	}
	if c.TokenAuth {
		if until, ok := cr.dead[c.Major]; ok && now.Before(until) {
			return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: until.Sub(now), Err: store.ErrWebhookGone}
		}
		return nil
	}
	if now.Before(cr.deadUntil) {
		return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: cr.deadUntil.Sub(now), Err: store.ErrUnauthorized}
	}
	return nil
}

// estimate returns a lower bound of how long a new claim on b would wait.
func (s *Store) estimate(cr *cred, b *bucket, c *store.Claim, now time.Time) time.Duration {
	at := now
	later := func(t time.Time) {
		if t.After(at) {
			at = t
		}
	}
	if b != nil {
		later(b.pauseUntil)
		later(cr.blocked)
		if ahead := b.q.len(); b.known && b.limit > 0 && b.remaining <= ahead && b.resetAt.After(now) {
			// The refill at resetAt serves the first limit waiters in line;
			// each further limit waits at least one more window.
			windows := (ahead - max(b.remaining, 0)) / b.limit
			later(b.resetAt.Add(time.Duration(windows) * b.span))
		}
	}
	if c.Global {
		later(cr.pauseUntil)
		if t, full := cr.global.next(globalWindow(c)); full {
			later(t)
		}
	}
	return at.Sub(now)
}

// cred returns the state of credential id, creating it.
func (s *Store) cred(id string, now time.Time) *cred {
	cr := s.creds[id]
	if cr == nil {
		cr = &cred{id: id, routes: make(map[string]*route), buckets: make(map[bkey]*bucket), probes: make(map[string]int)}
		s.creds[id] = cr
	}
	cr.lastUsed = now
	return cr
}

// resolve returns the bucket a request on route and major counts against,
// creating it, or nil when the route is known to have no bucket.
func (s *Store) resolve(cr *cred, routeName, major string, now time.Time) *bucket {
	r := cr.routes[routeName]
	if r == nil {
		r = &route{}
		cr.routes[routeName] = r
	}
	r.seen = now
	if r.none {
		// No bucket: only pauses (a Cloudflare block) and the global limit
		// apply, through the credential's unlimited bucket.
		return s.unlimited(cr, now)
	}
	if b := r.last; b != nil && !b.removed && b.key.major == major && b.key.hash == r.hash && r.hash != "" {
		b.lastUsed = now
		return b
	}
	k := bkey{hash: r.hash, major: major}
	if r.hash == "" {
		k.route = routeName
	}
	b := cr.buckets[k]
	if b == nil && r.hash != "" {
		// The route was learned on another major parameter while this one's
		// probe is still in flight: wait for that probe's answer.
		if probe := cr.buckets[bkey{route: routeName, major: major}]; probe != nil && probe.pending > 0 {
			return probe
		}
	}
	if b == nil {
		b = &bucket{key: k, c: cr}
		cr.buckets[k] = b
		s.nbuckets++
	}
	b.lastUsed = now
	if r.hash != "" && b.key.hash == r.hash {
		r.last = b
	}
	return b
}

// unlimited returns the credential's bucket for routes without one: it
// never runs out, but pauses like any other.
func (s *Store) unlimited(cr *cred, now time.Time) *bucket {
	k := bkey{route: "\x00none"}
	b := cr.buckets[k]
	if b == nil {
		b = &bucket{key: k, c: cr, unlimited: true}
		cr.buckets[k] = b
		s.nbuckets++
	}
	b.lastUsed = now
	return b
}

// available reports whether b can grant a slot now, refilling it when its
// window has passed and every request of the window has been reported.
func (b *bucket) available(now time.Time) bool {
	if now.Before(b.pauseUntil) || now.Before(b.c.blocked) || b.retired {
		return false
	}
	if b.unlimited {
		return true
	}
	if !b.known {
		// Probe: one request at a time until a response names the limits.
		return b.pending == 0
	}
	if !b.sliding && b.pending == 0 && !b.resetAt.IsZero() && !now.Before(b.resetAt) {
		b.remaining = b.limit
		b.resetAt = time.Time{}
	}
	return b.remaining > 0 || b.sliding && b.dripFree(now)
}

// tau is how long a sliding bucket is taken to need to give one slot back:
// an upper bound of the real time, so the model never drains too fast.
func (b *bucket) tau() time.Duration {
	if b.tauHi > 0 {
		return b.tauHi
	}
	return b.window / time.Duration(max(b.limit, 1))
}

// levelNow returns the model's level at now: what was counted, less what
// has drained since.
func (b *bucket) levelNow(now time.Time) float64 {
	tau := b.tau()
	if tau <= 0 || b.levelAt.IsZero() {
		return b.level
	}
	return max(0, b.level-float64(now.Sub(b.levelAt))/float64(tau))
}

// dripFree reports whether the leaky-bucket model has a slot at now, one
// offset's worth of drain to spare.
func (b *bucket) dripFree(now time.Time) bool {
	tau := b.tau()
	return tau > 0 && b.levelNow(now)+float64(b.offset)/float64(tau)+1 <= float64(b.limit)
}

// dripAt returns when the model next has a slot.
func (b *bucket) dripAt() time.Time {
	tau := b.tau()
	excess := b.level - (float64(b.limit) - 1 - float64(b.offset)/float64(tau))
	return b.levelAt.Add(time.Duration(max(excess, 0) * float64(tau)))
}

// wakeAt returns when b may become available by the passing of time alone,
// or the zero time when only a response can open it.
func (b *bucket) wakeAt(now time.Time) time.Time {
	at := b.pauseUntil
	if b.c.blocked.After(at) {
		at = b.c.blocked
	}
	if at.After(now) {
		return at
	}
	if b.known && b.remaining <= 0 && b.sliding {
		// No refill at the reset: slots come back by the drip alone.
		return later(b.dripAt(), now.Add(time.Millisecond))
	}
	if b.known && b.remaining <= 0 && b.pending == 0 && b.resetAt.After(now) {
		return b.resetAt
	}
	return time.Time{}
}

func (b *bucket) take(now time.Time) {
	b.pending++
	if b.probe() {
		b.c.probes[b.key.major]++
	}
	if !b.known || b.unlimited {
		return
	}
	b.level = b.levelNow(now) + 1
	b.levelAt = now
	b.remaining--
	if b.resetAt.IsZero() {
		b.resetAt = now.Add(b.window)
		b.estimated = true
	}
}

// probe reports whether b is the counter of a route whose bucket is not
// known yet.
func (b *bucket) probe() bool { return b.key.route != "" && !b.unlimited }

// settle counts a granted request as answered (or never sent).
func (b *bucket) settle() {
	if b.pending > 0 {
		b.pending--
		if b.probe() {
			if b.c.probes[b.key.major]--; b.c.probes[b.key.major] <= 0 {
				delete(b.c.probes, b.key.major)
			}
		}
	}
}

// giveBack returns a slot taken by a request that was never sent.
func (b *bucket) giveBack() {
	b.settle()
	if b.known && b.remaining < b.limit {
		b.remaining++
	}
	if b.level >= 1 {
		b.level-- // approximately: the model only errs towards full
	}
}

// observe applies rate-limit headers received at now. Within a window the
// remaining count only goes down and the reset only moves later, so a stale
// or reordered response never reopens a window early.
func (b *bucket) observe(now time.Time, u *store.Update) {
	limit, remaining := u.Limit, u.Remaining
	after := u.ResetAfter
	if after < 0 {
		after = max(b.window, time.Second)
	}
	reset := now.Add(store.ClampDuration(after) + store.ClampDuration(u.Offset))
	if limit > 0 && remaining == limit-1 && u.ResetAfter > 0 && (b.span == 0 || u.ResetAfter < b.span) {
		b.span = u.ResetAfter
	}
	b.offset = store.ClampDuration(u.Offset)
	if u.ResetAfter >= 0 {
		b.watchSliding(now, now.Add(u.ResetAfter), limit, remaining)
	}
	// The level a response reports: Reset-After divided by the shortest
	// drain time it can be (precise to the millisecond), or failing that
	// the count Remaining implies. Requests in flight are in the model
	// already: take adds each grant. The model never forgets a request faster than the bucket drains: a
	// reordered response showing a lower level does not lower it.
	reported := float64(limit - remaining)
	if u.ResetAfter >= 0 && limit > 0 {
		used := limit - remaining // level is in (used-1, used]
		if used >= 1 {
			if lo := u.ResetAfter / time.Duration(used); lo > b.tauLo {
				b.tauLo = lo
			}
		}
		if used >= 2 {
			if hi := u.ResetAfter / time.Duration(used-1); b.tauHi == 0 || hi < b.tauHi {
				b.tauHi = hi
			}
		}
		if b.tauLo > 0 {
			reported = max(reported-1, float64(u.ResetAfter)/float64(b.tauLo))
		}
	}
	b.level = max(b.levelNow(now), reported)
	b.levelAt = now
	if !b.known {
		b.known = true
		b.limit = limit
		b.remaining = remaining
		if !b.probe() {
			// Requests in flight on routes not learned yet may share this
			// bucket: Discord has counted them, this response may not.
			b.remaining = max(0, remaining-b.c.probes[b.key.major])
		}
		b.resetAt = reset
		b.window = reset.Sub(now)
		return
	}
	if limit != b.limit {
		b.tauLo, b.tauHi = 0, 0 // the drain time changes with the limit
	}
	if limit > b.limit {
		b.remaining += limit - b.limit
	}
	b.limit = limit
	if remaining < b.remaining {
		b.remaining = remaining
	}
	if b.estimated || b.resetAt.IsZero() || reset.After(b.resetAt) {
		b.resetAt = reset
		b.estimated = false
	}
	if w := reset.Sub(now); w > b.window {
		b.window = w
	}
}

// slidingGuard keeps the comparison of two responses inside one window of
// a fixed bucket: a response that arrives within the last quarter of a
// window (and at least this close to the announced reset) may already
// belong to the next window, and is not compared.
const slidingGuard = 20 * time.Millisecond

// watchSliding compares a response with the previous one. Inside one
// window, a fixed bucket's full-again moment stays put whatever the count,
// while a sliding bucket's moves by window/limit per request counted
// between the two responses (later for more used, earlier for fewer: the
// comparison does not depend on the order responses arrive in). Two such
// moves in a row make the bucket sliding; a count that changes while the
// moment stays put makes it fixed again.
func (b *bucket) watchSliding(now, instant time.Time, limit, remaining int) {
	prev, prevSeen, prevRemaining := b.instant, b.seenAt, b.seenRemaining
	b.instant, b.seenAt, b.seenRemaining = instant, now, remaining
	if prevSeen.IsZero() || limit <= 0 || !now.Before(prev.Add(-max(slidingGuard, b.window/4))) {
		return // no previous response in this window
	}
	k := prevRemaining - remaining // requests counted between the two
	if k == 0 {
		return
	}
	d := instant.Sub(prev)
	if k < 0 {
		k, d = -k, -d
	}
	tau := b.window / time.Duration(max(limit, 1))
	switch {
	case d > time.Duration(k)*max(tau/2, 2*time.Millisecond):
		b.evidence++
		if b.evidence >= 2 {
			b.sliding = true
		}
	case d < 5*time.Millisecond && d > -5*time.Millisecond:
		b.evidence = 0
		b.sliding = false
		b.tauLo, b.tauHi = 0, 0
	}
}

// pumpBucket grants b's waiters while b has slots and arms a timer for the
// moment it may have more.
func (s *Store) pumpBucket(b *bucket, now time.Time) {
	if s.closed {
		return
	}
	cr := b.c
	moved := false
	for !b.q.empty() {
		w := b.q.front()
		// The route may have learned its bucket, or moved to another one,
		// since w queued: follow it, keeping arrival order.
		if nb := s.resolve(cr, w.route, w.major, now); nb != b {
			b.q.pop()
			w.b = nb
			if nb == nil {
				s.enterGlobal(cr, w, now)
			} else {
				nb.q.insert(w)
				s.pumpBucket(nb, now)
			}
			moved = true
			continue
		}
		if !b.available(now) {
			break
		}
		b.q.pop()
		b.take(now)
		s.enterGlobal(cr, w, now)
	}
	if moved || !b.q.empty() {
		s.arm(b, now)
	}
}

// enterGlobal passes a waiter that holds its bucket slot on to the global
// window, or grants it when the global limit does not apply.
func (s *Store) enterGlobal(cr *cred, w *waiter, now time.Time) {
	if !w.global {
		w.stage = stageGranted
		close(w.ready)
		return
	}
	w.stage = stageGlobal
	cr.globalQ.push(w)
	s.pumpGlobal(cr, now, 0)
}

// pumpGlobal grants the credential's global waiters while the window allows.
func (s *Store) pumpGlobal(cr *cred, now time.Time, window time.Duration) {
	if s.closed {
		return
	}
	if window <= 0 {
		window = cr.global.window
	}
	if window <= 0 {
		window = store.DefaultGlobalWindow
	}
	for !cr.globalQ.empty() {
		if !cr.globalReady(now, window) {
			at := cr.pauseUntil
			if t, full := cr.global.next(window); full && t.After(at) {
				at = t
			}
			s.armGlobal(cr, now, at)
			return
		}
		w := cr.globalQ.pop()
		w.token = cr.global.push(now.Add(w.offset))
		w.stage = stageGranted
		close(w.ready)
	}
}

func (cr *cred) globalReady(now time.Time, window time.Duration) bool {
	cr.global.window = window
	if now.Before(cr.pauseUntil) {
		return false
	}
	t, full := cr.global.next(window)
	return !full || !now.Before(t)
}

// arm makes sure b is pumped again when time alone may open it.
func (s *Store) arm(b *bucket, now time.Time) {
	at := b.wakeAt(now)
	if at.IsZero() {
		return
	}
	s.wake(&b.alarm, now, at, func() { s.pumpBucket(b, s.clock.Now()) })
}

func (s *Store) armGlobal(cr *cred, now, at time.Time) {
	if !at.After(now) {
		at = now.Add(time.Millisecond)
	}
	s.wake(&cr.alarm, now, at, func() { s.pumpGlobal(cr, s.clock.Now(), 0) })
}

// alarm is a timer that only ever moves earlier.
type alarm struct {
	timer clock.Timer
	at    time.Time
}

func (a *alarm) armed() bool { return a.timer != nil }

func (a *alarm) stop() {
	if a.timer != nil {
		a.timer.Stop()
		a.timer = nil
	}
}

// wake sets a to run pump under the store's lock at at, unless it is set
// to go off no later already.
func (s *Store) wake(a *alarm, now, at time.Time, pump func()) {
	if a.timer != nil {
		if !a.at.After(at) {
			return
		}
		a.timer.Stop()
	}
	a.at = at
	a.timer = s.clock.AfterFunc(at.Sub(now), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		a.timer = nil
		pump()
	})
}

// Update implements [store.Store].
func (s *Store) Update(ctx context.Context, p store.Permit, update store.Update) error {
	u := &update
	now := s.clock.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	granted, _ := p.Handle.(*bucket)
	var cr *cred
	if granted != nil {
		cr = granted.c
		cr.lastUsed = now
	} else {
		cr = s.cred(u.Credential, now)
	}
	if !u.Sent {
		cr.global.remove(p.Token)
		if granted != nil {
			granted.giveBack()
			s.pumpBucket(granted, now)
		}
		return nil
	}
	if granted != nil {
		granted.settle()
	}
	// The request has reached Discord by now: its global slot's window
	// starts no later than this.
	cr.global.settle(p.Token, now)

	offset := store.ClampDuration(u.Offset)
	retry := store.ClampDuration(u.RetryAfter) + offset
	target := granted
	var r *route
	if granted == nil || u.Bucket == "" || granted.key.hash != u.Bucket || granted.key.major != u.Major {
		// The response may teach this route something new: look it up.
		// (When it confirms the bucket it was granted from, nothing changes.)
		r = cr.routes[u.Route]
		if r == nil {
			r = &route{seen: now}
			cr.routes[u.Route] = r
		}
	}
	switch {
	case r == nil:
	case u.Bucket != "":
		if r.hash != u.Bucket || r.none {
			r.hash, r.none = u.Bucket, false
			if granted != nil && granted.key.route != "" && !granted.unlimited {
				granted.retired = true
			}
		}
		target = s.resolve(cr, u.Route, u.Major, now)
	case u.Status >= 200 && u.Status < 300 && !u.HasLimit && r.hash == "":
		// Answered without rate-limit headers: bound by the global limit only.
		r.none = true
		if granted != nil && granted.key.route != "" && !granted.unlimited {
			granted.retired = true
		}
		target = nil
	}

	if u.Status == 429 {
		switch u.Scope {
		case store.ScopeGlobal:
			cr.pauseUntil = later(cr.pauseUntil, now.Add(retry))
		case store.ScopeShared:
			if target != nil {
				target.pauseUntil = later(target.pauseUntil, now.Add(retry))
			}
		case store.ScopeBlocked:
			cr.blocked = later(cr.blocked, now.Add(retry))
			cr.pauseUntil = later(cr.pauseUntil, cr.blocked)
		default: // user, and unknown scopes treated as conservatively
			if target != nil {
				if u.HasLimit {
					target.observe(now, u)
				}
				target.pauseUntil = later(target.pauseUntil, now.Add(retry))
				target.sliding, target.evidence = false, 0
				if target.known {
					target.remaining = 0
					if target.resetAt.Before(target.pauseUntil) {
						target.resetAt, target.estimated = target.pauseUntil, false
					}
				}
			} else {
				cr.pauseUntil = later(cr.pauseUntil, now.Add(retry))
			}
		}
	} else if u.HasLimit && target != nil {
		target.observe(now, u)
	}

	s.count(cr, u, now)

	if granted != nil {
		s.pumpBucket(granted, now)
	}
	if target != nil && target != granted {
		s.pumpBucket(target, now)
	}
	if u.Status == 429 {
		for _, b := range cr.buckets {
			if !b.q.empty() {
				s.arm(b, now)
			}
		}
	}
	s.pumpGlobal(cr, now, 0)
	return nil
}

// count feeds the invalid-request guard and the 401/404 cooldowns.
func (s *Store) count(cr *cred, u *store.Update, now time.Time) {
	switch {
	case u.Status == 401, u.Status == 403, u.Status == 429 && u.Scope != store.ScopeShared:
		s.invalid.add(now)
	}
	cooldown := u.Cooldown
	if cooldown == 0 {
		cooldown = store.DefaultCooldown
	}
	if cooldown < 0 {
		return
	}
	switch {
	case u.TokenAuth && (u.Status == 401 || u.Status == 404):
		if cr.dead == nil {
			cr.dead = make(map[string]time.Time)
		}
		cr.dead[u.Major] = now.Add(cooldown)
	case !u.TokenAuth && u.Status == 401:
		cr.deadUntil = now.Add(cooldown)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Close implements [store.Store]: it releases every waiter with
// [store.ErrClosed]. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	close(s.done)
	for _, cr := range s.creds {
		cr.alarm.stop()
		for _, b := range cr.buckets {
			b.alarm.stop()
		}
	}
	return nil
}

// maybeSweep drops idle state when the store has doubled in size since the
// last sweep, or a minute has passed.
func (s *Store) maybeSweep(now time.Time) {
	if s.nbuckets < s.sweepAt && now.Sub(s.lastSweep) < sweepEvery {
		return
	}
	s.sweep(now)
	s.lastSweep = now
	s.sweepAt = max(minSweep, 2*s.nbuckets)
}

// sweep removes buckets whose windows have fully reset and that nobody uses,
// routes unused for routeTTL, and credentials left with nothing.
func (s *Store) sweep(now time.Time) {
	for id, cr := range s.creds {
		for k, b := range cr.buckets {
			if b.idle(now) {
				b.removed = true
				delete(cr.buckets, k)
				s.nbuckets--
			}
		}
		for name, r := range cr.routes {
			if now.Sub(r.seen) > routeTTL {
				delete(cr.routes, name)
			}
		}
		for m, until := range cr.dead {
			if !now.Before(until) {
				delete(cr.dead, m)
			}
		}
		if len(cr.buckets) == 0 && len(cr.routes) == 0 && len(cr.dead) == 0 && cr.idle(now) {
			delete(s.creds, id)
		}
	}
}

func (b *bucket) idle(now time.Time) bool {
	if b.pending > 0 || !b.q.empty() || b.alarm.armed() || now.Before(b.pauseUntil) {
		return false
	}
	return b.retired || !b.known || b.resetAt.IsZero() || !now.Before(b.resetAt)
}

func (cr *cred) idle(now time.Time) bool {
	if !cr.globalQ.empty() || cr.alarm.armed() || now.Before(cr.pauseUntil) || now.Before(cr.deadUntil) {
		return false
	}
	t, ok := cr.global.newest()
	return !ok || now.Sub(t) > cr.global.window
}

// Len returns the number of buckets the store holds, for tests and metrics.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nbuckets
}

func globalLimit(c *store.Claim) int {
	if c.GlobalLimit > 0 {
		return c.GlobalLimit
	}
	return store.DefaultGlobalLimit
}

func globalWindow(c *store.Claim) time.Duration {
	if c.GlobalWindow > 0 {
		return c.GlobalWindow
	}
	return store.DefaultGlobalWindow
}

func invalidBudget(c *store.Claim) int {
	if c.InvalidBudget == 0 {
		return store.DefaultInvalidBudget
	}
	return c.InvalidBudget
}
