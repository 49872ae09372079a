// Package memstore keeps ratecord's rate-limit state in the memory of one
// process. It is the store a Transport uses when it is given none.
//
// The rules of buckets and credentials are ratecord's one rate-limit model
// (the same the Redis store's scripts implement); this package adds the
// waiting. Waiters queue per bucket in arrival order and are handed their
// slot directly when it opens: no waiter polls, and no more waiters wake
// than there are slots. Requests that pass their bucket and count against
// the global limit then queue, in arrival order again, for the credential's
// global window.
//
// Idle state is swept as the store grows and on a timer while it holds
// state, and the number of credentials and routes kept is bounded (see
// [WithMaxEntries]), so memory stays bounded however many distinct
// credentials, routes and tokens pass, and however fast: a credential
// beyond the bound whose requests still count in its global window costs
// a few tens of bytes until they no longer do.
package memstore

import (
	"context"
	"hash/maphash"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/edge"
	"github.com/ratecord/ratecord/store/internal/model"
)

// Store is an in-memory [store.Store]. The zero value is not usable; create
// one with [New]. It is safe for concurrent use.
type Store struct {
	mu         sync.Mutex // guards every field below and all state reachable from creds
	clock      clock.Clock
	epoch      time.Time // the store's milliseconds count from here
	creds      map[string]*cred
	credsPeak  int // most credentials held since creds was last allocated
	invalid    invalidLog
	seq        uint64
	closed     bool
	done       chan struct{}
	nbuckets   int
	nroutes    int
	maxEntries int
	sweepAt    int
	sweeps     int // sweeps run, for tests
	lastSweep  int64
	sweeper    alarm // sweeps while no request comes
	pol        store.Policy
	gates      *edge.Gates // Cloudflare blocks
	hold       int64       // pol.GlobalHold in milliseconds
	offset     int64       // pol.ResetOffset in milliseconds
	span       int64       // pol.GlobalWindow in milliseconds

	// What the limits still need of the credentials the bound forgot (see
	// fold.go), by digest under seed.
	seed       maphash.Seed
	folds      map[uint64]fold
	foldsMin   int64 // at most the earliest moment a record in folds lapses
	foldsPeak  int   // most records held since folds was allocated
	foldsSwept int64 // when sweepFolds last looked at them
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

// WithPolicy sets what the store applies to every request: the global
// limit and window, the invalid-request budget, cooldowns and safety
// margins. Without it the store applies the zero Policy's defaults.
func WithPolicy(p store.Policy) Option {
	return optionFunc(func(s *Store) { s.pol = p })
}

// WithMaxEntries bounds the number of credentials and routes the store
// keeps to about n: beyond it, the least recently used routes are
// forgotten, and so are the credentials left without routes once nothing
// of them is in flight or waiting. Of such a credential the store keeps, in
// 8 bytes, what its limits still need: the requests that count in its
// global window, and the reset of a bucket it has spent. Of the routes
// unused for ten seconds it keeps at most n/32, so that the memory of a
// burst of many credentials goes within seconds of its end. State in use
// (requests in flight or waiting, pauses, cooldowns) is never dropped, even
// beyond the bound. The default is [DefaultMaxEntries]; a value below one
// is ignored.
func WithMaxEntries(n int) Option {
	return optionFunc(func(s *Store) {
		if n > 0 {
			s.maxEntries = n
		}
	})
}

// New returns an empty Store. It starts no goroutine: timers run only while
// requests wait, and while it holds state, a timer sweeps it every minute
// (every ten seconds while it holds more routes than it keeps idle). Call
// Close to stop them.
func New(opts ...Option) *Store {
	s := &Store{
		clock:      clock.Real{},
		creds:      make(map[string]*cred),
		folds:      make(map[uint64]fold),
		foldsMin:   math.MaxInt64,
		seed:       maphash.MakeSeed(),
		done:       make(chan struct{}),
		sweepAt:    minSweep,
		maxEntries: DefaultMaxEntries,
	}
	for _, o := range opts {
		if o != nil {
			o.apply(s)
		}
	}
	s.pol = s.pol.Normalize()
	s.gates = edge.New(s.clock, s.pol.BlockPause, s.pol.BlockPauseMax, "", nil, nil, 0)
	s.gates.SetOffset(s.pol.ResetOffset)
	s.hold = millis(s.pol.GlobalHold)
	s.offset = millis(s.pol.ResetOffset)
	s.span = millis(s.pol.GlobalWindow)
	// The model reads 0 as "never": the store's time starts well after it.
	s.epoch = s.clock.Now().Add(-time.Hour)
	s.lastSweep = s.now()
	s.invalid.sumIdx = -1
	return s
}

// now returns the store's time in milliseconds, rounded down.
func (s *Store) now() int64 { return s.ms(s.clock.Now()) }

// ms returns t in the store's milliseconds, rounded down.
func (s *Store) ms(t time.Time) int64 { return t.Sub(s.epoch).Milliseconds() }

// ms converts a number of the store's milliseconds to a duration.
func ms(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// millis converts d to milliseconds, rounding up.
func millis(d time.Duration) int64 { return int64((d + time.Millisecond - 1) / time.Millisecond) }

// cred is the state of one credential.
type cred struct {
	id       string
	routes   map[string]*route
	buckets  map[bkey]*bucket
	global   window
	globalQ  queue // waiters that hold their bucket slot and wait for the global window
	m        model.Cred
	dead     map[string]int64     // token-authenticated majors that answered 401 or 404
	probes   map[string]probing   // requests in flight on routes whose bucket is unknown, by major
	subs     map[subKey]*sublimit // hidden sublimits, by the requests they hold
	alarm    alarm                // pumps the global queue when its window opens
	lastUsed int64
	until    int64 // the buckets it makes are paused until then (see fold.go)
	// recalled is when (ms) a global 429 last paused the credential: its
	// grants from before then that have not left are taken back.
	recalled atomic.Int64

	routesPeak, bucketsPeak int // most routes and buckets held since their maps were allocated
}

type waiter struct {
	seq     uint64
	route   string
	major   string
	global  bool
	offset  int64
	b       *bucket // the bucket the waiter queues on or was granted from
	stage   int     // stageBucket, stageGlobal or stageGranted
	token   uint64  // the global window's token, once granted
	granted int64   // when the global window granted it (ms)
	urgent  bool    // in the urgent lane
	spacing int64   // the claim's Spacing in milliseconds
	retry   bool    // the claim's Retry: it keeps its place in line
	ready   chan struct{}
}

const (
	stageBucket = iota
	stageGlobal
	stageGranted
	stageGone
)

// Policy returns the policy the store applies, defaults filled in.
func (s *Store) Policy() store.Policy { return s.pol }

// Estimate implements [store.Estimator]. It takes no slot; it may remember
// the claim's route, as Acquire would.
func (s *Store) Estimate(ctx context.Context, claim store.Claim) (time.Duration, error) {
	c := &claim
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, &store.WaitError{Err: store.ErrClosed}
	}
	now := s.now()
	cr := s.cred(c.Credential, now)
	if err := s.refuse(cr, c, now); err != nil {
		return 0, err
	}
	b := s.resolve(cr, c.Route, c.Major, now)
	seed(b, c)
	wait := max(s.estimate(cr, b, c, now), millis(s.gates.Estimate(c.Route)))
	if until := cr.sublimitWait(c, now); until > 0 {
		wait = max(wait, until-now)
	}
	if c.Global {
		// The claims queued for the global window ahead of this one.
		limit := int64(s.pol.Limit(c))
		if n := int64(cr.globalQ.len()); n >= limit {
			wait = max(wait, n/limit*millis(s.pol.GlobalWindow))
		}
	}
	return ms(wait), nil
}

var _ store.Estimator = (*Store)(nil)

// Acquire implements [store.Store].
func (s *Store) Acquire(ctx context.Context, claim store.Claim) (*store.Reservation, error) {
	// A Cloudflare block holds the claim before its bucket does.
	return s.gates.Acquire(ctx, claim, s.clock.Now(), s.done, func(c store.Claim) (*store.Reservation, error) {
		return s.acquireSub(ctx, c)
	})
}

// BlockedFor implements [store.BlockGate]: the store holds Cloudflare
// blocks for every credential.
func (s *Store) BlockedFor(route string) time.Duration { return s.gates.Estimate(route) }

// Holding implements [store.BlockGate].
func (s *Store) Holding(r *store.Reservation) bool { return s.gates.Holding(r) }

// acquireSub is Acquire once no Cloudflare block holds the claim.
func (s *Store) acquireSub(ctx context.Context, claim store.Claim) (*store.Reservation, error) {
	for {
		turn, err := s.awaitSublimit(ctx, &claim)
		if err != nil {
			return nil, err
		}
		r, err := s.acquire(ctx, claim)
		if err != nil && turn {
			s.mu.Lock()
			if cr := s.creds[claim.Credential]; cr != nil {
				cr.releaseSublimit(&claim, s.now())
			}
			s.mu.Unlock()
		}
		if err != nil || turn || !s.sublimitCame(&claim) {
			return r, err
		}
		// A sublimit's 429 came while the claim waited for its bucket:
		// give the slot back and wait for the sublimit's turn.
		r.Recycle()
	}
}

// sublimitCame reports whether a hidden sublimit now holds c, which went
// past it before it held.
func (s *Store) sublimitCame(c *store.Claim) bool {
	if c.Kind == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	cr := s.creds[c.Credential]
	if cr == nil || len(cr.subs) == 0 {
		return false
	}
	e := cr.subs[subKeyOf(c)]
	return e != nil && (s.now() < e.end || e.busy || len(e.line) > 0)
}

// acquire is Acquire once no hidden sublimit holds the claim.
func (s *Store) acquire(ctx context.Context, claim store.Claim) (*store.Reservation, error) {
	c := &claim
	if err := ctx.Err(); err != nil {
		return nil, &store.WaitError{Err: err}
	}
	select {
	case <-c.Done:
		return nil, &store.WaitError{Err: store.ErrClosed}
	default:
	}
	s.mu.Lock()
	// One clock read: under the lock, so the store's time never runs
	// backwards between grants.
	start := s.clock.Now()
	now := s.ms(start)
	if s.closed {
		s.mu.Unlock()
		return nil, &store.WaitError{Err: store.ErrClosed}
	}
	s.maybeSweep(now)
	cr := s.cred(c.Credential, now)
	if err := s.refuse(cr, c, now); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	b := s.resolve(cr, c.Route, c.Major, now)
	seed(b, c)
	if c.Global {
		cr.global.configure(now, s.pol.Limit(c), millis(s.pol.GlobalWindow))
	}
	if (b == nil || b.q.empty() && b.available(now)) && (!c.Global || cr.globalQ.empty() && cr.globalReady(now)) {
		tok := s.grant(cr, b, c, now)
		s.mu.Unlock()
		r := store.NewReservation(s, claim, hashOf(b), 0, handle(b), tok)
		s.lapse(r, now)
		return r, nil
	}

	if wait := s.estimate(cr, b, c, now); wait > 0 || c.NoWait {
		err := store.CheckWait(ctx, c, start, ms(wait))
		if c.NoWait && err == nil {
			err = store.ErrWaitTooLong // it cannot go at once
		}
		if err != nil {
			scope := store.ScopeUser
			if b == nil || (c.Global && b.q.empty() && b.available(now)) {
				scope = store.ScopeGlobal
			}
			s.mu.Unlock()
			return nil, &store.WaitError{Bucket: hashOf(b), Scope: scope, RetryAfter: ms(wait), Err: err}
		}
	}
	s.seq++
	w := &waiter{seq: s.seq, route: c.Route, major: c.Major, global: c.Global, offset: s.hold, b: b, urgent: c.Priority == store.PriorityUrgent, spacing: millis(c.Spacing), retry: c.Retry, ready: make(chan struct{})}
	if b != nil {
		b.q.push(w)
		s.pumpBucket(b, now)
	} else {
		w.stage = stageGlobal
		cr.globalQ.push(w)
		s.pumpGlobal(cr, now)
	}
	s.mu.Unlock()
	return s.wait(ctx, c, cr, w, start)
}

// wait blocks until w is granted or gives up.
func (s *Store) wait(ctx context.Context, c *store.Claim, cr *cred, w *waiter, start time.Time) (*store.Reservation, error) {
	var expired <-chan time.Time
	if c.MaxWait > 0 {
		t := s.clock.NewTimer(c.MaxWait)
		defer t.Stop()
		expired = t.C()
	}
	var err error
	select {
	case <-w.ready:
		r := store.NewReservation(s, *c, hashOf(w.b), s.clock.Now().Sub(start), handle(w.b), w.token)
		s.lapse(r, w.granted)
		return r, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-c.Done:
		err = store.ErrClosed
	case <-s.done:
		err = store.ErrClosed
	case <-expired:
		err = store.ErrWaitTooLong
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	scope := store.ScopeUser
	if w.stage == stageGlobal {
		scope = store.ScopeGlobal
	}
	if w.b != nil && now < w.b.Pause {
		scope = store.ScopeShared
	}
	werr := &store.WaitError{Bucket: hashOf(w.b), Scope: scope, Err: err}
	if !s.closed {
		werr.RetryAfter = ms(s.estimate(cr, w.b, c, now))
	}
	s.abandon(cr, w, now)
	return nil, werr
}

// abandon takes w out of line and gives back what it holds.
func (s *Store) abandon(cr *cred, w *waiter, now int64) {
	switch w.stage {
	case stageBucket:
		w.b.q.remove(w)
	case stageGlobal:
		cr.globalQ.remove(w)
		if w.b != nil {
			w.b.giveBack(now)
		}
	case stageGranted:
		if w.b != nil {
			w.b.giveBack(now)
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
	s.pumpGlobal(cr, now)
}

// grant takes a slot from b (if any) and from the global window (if global)
// and returns the global window's token, or 0.
func (s *Store) grant(cr *cred, b *bucket, c *store.Claim, now int64) uint64 {
	if b != nil {
		b.take(now, s.hold)
	}
	if c.Global {
		return cr.global.push(now, now+s.hold)
	}
	return 0
}

// lapse sets when r, granted at (ms), lapses: half the hold after the
// grant (see [store.Reservation.SendBy]).
func (s *Store) lapse(r *store.Reservation, at int64) {
	r.SendBy = s.epoch.Add(time.Duration(at+s.hold/2) * time.Millisecond)
}

// Lapsed implements [store.Lapser]: a grant lapses half the hold after it
// was made, or once a response since spent its bucket (see bucket.recall).
func (s *Store) Lapsed(r *store.Reservation) bool {
	if r.SendBy.IsZero() {
		return false
	}
	now, by := s.now(), s.ms(r.SendBy)
	if now > by {
		return true
	}
	handle, _ := r.Handle()
	b, _ := handle.(*bucket)
	if b == nil {
		return false
	}
	granted := by - s.hold/2
	bucket := b.recalled.Load() >= granted
	global := r.Claim.Global && b.c.recalled.Load() >= granted
	if !bucket && !global {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return bucket && b.spent(now, true) || global && now < b.c.m.Pause
}

// seed applies the claim's spacing to b, if any.
func seed(b *bucket, c *store.Claim) {
	if b != nil && c.Spacing > 0 {
		b.Seed(millis(store.ClampDuration(c.Spacing)))
	}
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

// estimate returns a lower bound of how long a new claim on b would wait,
// in milliseconds.
func (s *Store) estimate(cr *cred, b *bucket, c *store.Claim, now int64) int64 {
	at := now
	if b != nil {
		at = b.Bound(now, int64(b.q.len()))
	}
	if c.Global {
		at = max(at, cr.m.Pause)
		if t, full := cr.global.next(now); full {
			at = max(at, t)
		}
	}
	return at - now
}

// cred returns the state of credential id, creating it.
func (s *Store) cred(id string, now int64) *cred {
	cr := s.creds[id]
	if cr == nil {
		cr = &cred{id: id, routes: make(map[string]*route), buckets: make(map[bkey]*bucket), probes: make(map[string]probing)}
		s.creds[id] = cr
		s.unfold(cr, now)
		s.armSweep(now)
	}
	cr.lastUsed = now
	return cr
}

// pumpBucket grants b's waiters while b has slots and arms a timer for the
// moment it may have more.
func (s *Store) pumpBucket(b *bucket, now int64) {
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
		// A response naming another limit may have cleared the hold the
		// waiter's claim seeds: seed it again before granting.
		b.Seed(w.spacing)
		if !b.available(now) {
			break
		}
		b.q.pop()
		b.take(now, s.hold)
		s.enterGlobal(cr, w, now)
	}
	if moved || !b.q.empty() {
		s.arm(b, now)
	}
}

// pumpMajor pumps the buckets of major that have waiters, after the answer
// of a probe on it gave back the slot they kept for it (see bucket.kept).
func (s *Store) pumpMajor(cr *cred, major string, now int64) {
	var waiting []*bucket
	for _, b := range cr.buckets {
		if b.key.major == major && !b.Probe && !b.q.empty() {
			waiting = append(waiting, b)
		}
	}
	for _, b := range waiting {
		s.pumpBucket(b, now)
	}
}

// enterGlobal passes a waiter that holds its bucket slot on to the global
// window, or grants it when the global limit does not apply.
func (s *Store) enterGlobal(cr *cred, w *waiter, now int64) {
	if !w.global {
		w.stage = stageGranted
		close(w.ready)
		return
	}
	w.stage = stageGlobal
	cr.globalQ.push(w)
	s.pumpGlobal(cr, now)
}

// pumpGlobal grants the credential's global waiters while the window allows.
func (s *Store) pumpGlobal(cr *cred, now int64) {
	if s.closed {
		return
	}
	for !cr.globalQ.empty() {
		if !cr.globalReady(now) {
			at := cr.m.Pause
			if t, full := cr.global.next(now); full && t > at {
				at = t
			}
			s.armGlobal(cr, now, at)
			return
		}
		w := cr.globalQ.pop()
		w.token = cr.global.push(now, now+w.offset)
		w.granted = now
		w.stage = stageGranted
		close(w.ready)
	}
}

func (cr *cred) globalReady(now int64) bool {
	if now < cr.m.Pause {
		return false
	}
	t, full := cr.global.next(now)
	return !full || now >= t
}

// arm makes sure b is pumped again when time alone may open it.
func (s *Store) arm(b *bucket, now int64) {
	at := b.WakeAt(now)
	if _, u := b.kept(now); u > 0 && (at == 0 || u < at) {
		// The slots kept for probes come back when they are overdue at
		// the latest (their answers pump the buckets of their major).
		at = u
	}
	if at == 0 {
		return
	}
	s.wake(&b.alarm, now, at, func() { s.pumpBucket(b, s.now()) })
}

func (s *Store) armGlobal(cr *cred, now, at int64) {
	if at <= now {
		at = now + 1
	}
	s.wake(&cr.alarm, now, at, func() { s.pumpGlobal(cr, s.now()) })
}

// alarm is a timer that only ever moves earlier.
type alarm struct {
	timer clock.Timer
	at    int64
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
func (s *Store) wake(a *alarm, now, at int64, pump func()) {
	if a.timer != nil {
		if a.at <= at {
			return
		}
		a.timer.Stop()
	}
	a.at = at
	a.timer = s.clock.AfterFunc(ms(at-now), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		a.timer = nil
		pump()
	})
}

// Settle implements [store.Settler]: [store.Reservation.Report] and
// [store.Reservation.Cancel] call it.
func (s *Store) Settle(ctx context.Context, r *store.Reservation, update store.Update) error {
	u := &update
	c := &r.Claim
	handle, token := r.Handle()
	s.gates.Settle(r, c, u)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if s.closed {
		return store.ErrClosed
	}
	granted, _ := handle.(*bucket)
	var cr *cred
	if granted != nil {
		cr = granted.c
		cr.lastUsed = now
	} else {
		cr = s.cred(c.Credential, now)
	}
	cr.releaseSublimit(c, now)
	if !u.Sent {
		if token != 0 {
			cr.global.remove(token)
		}
		if granted != nil {
			granted.giveBack(now)
			s.pumpBucket(granted, now)
			if granted.Probe {
				s.pumpMajor(cr, c.Major, now)
			}
		}
		return nil
	}
	if granted != nil {
		switch {
		case u.Status == 0:
			granted.unanswered(now)
		case model.Uncounted(int64(u.Status), string(u.Scope), u.HasLimit):
			granted.giveBack(now)
		default:
			granted.settle()
		}
	}
	// The request has reached Discord by now: its global slot's window
	// counts from now (later than its bound when it left late).
	if token != 0 {
		cr.global.settle(token, now, now)
	}

	offset := s.offset
	retry := millis(store.ClampDuration(u.RetryAfter)) + offset
	target := granted
	if granted == nil || u.Bucket == "" || granted.key.hash != u.Bucket || granted.key.major != c.Major {
		// The response may teach this route something new. (When it
		// confirms the bucket it was granted from, nothing changes.)
		target = s.learn(cr, granted, c, u, now)
	}

	h := model.Headers{Limit: int64(u.Limit), Remaining: int64(u.Remaining), ResetAfter: -1, Offset: offset,
		Reset: model.ResetMillis(u.Reset)}
	if u.ResetAfter >= 0 {
		h.ResetAfter = millis(store.ClampDuration(u.ResetAfter))
	}
	probes := cr.probes[c.Major].n
	glimit, tlimit := limitOf(granted), limitOf(target) // before the response, for recall
	if u.Status == 429 {
		switch {
		case cr.m.Limited(now, string(u.Scope), retry):
			if u.Scope == store.ScopeGlobal {
				cr.recalled.Store(now)
			}
		case u.Scope == store.ScopeShared:
			// No wait: the gates hold the resource alone (edge.Gates.Settle).
			if target != nil && u.RetryAfter > 0 {
				target.Shared(now, retry)
			}
			if target != nil && u.HasLimit {
				target.Observe(now, h, probes)
			}
		case target != nil && c.Kind != "" && u.Scope == store.ScopeUser && u.HasLimit &&
			model.HiddenSublimit(retry, h.ResetAfter, offset, h.Remaining) && cr.holdSublimit(c, now, retry):
			// A hidden sublimit of the request's kind: only its kind waits;
			// the bucket follows its headers.
			target.Observe(now, h, probes)
		case target != nil: // user, and unknown scopes treated as conservatively
			var hp *model.Headers
			if u.HasLimit {
				hp = &h
			}
			target.Limited(now, retry, hp, probes)
		default:
			cr.m.Pause = max(cr.m.Pause, now+retry)
		}
	} else if u.HasLimit && target != nil {
		target.Observe(now, h, probes)
	}

	s.count(cr, c, u, now)
	granted.recall(now, glimit)
	if target != granted {
		target.recall(now, tlimit)
	}

	if granted != nil {
		s.pumpBucket(granted, now)
	}
	if target != nil && target != granted {
		s.pumpBucket(target, now)
	}
	if granted != nil && granted.Probe {
		s.pumpMajor(cr, c.Major, now)
	}
	if u.Status == 429 {
		for _, b := range cr.buckets {
			if !b.q.empty() {
				s.arm(b, now)
			}
		}
	}
	s.pumpGlobal(cr, now)
	return nil
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
	s.sweeper.stop()
	for _, cr := range s.creds {
		cr.alarm.stop()
		for _, b := range cr.buckets {
			b.alarm.stop()
		}
	}
	return nil
}

// Len returns the number of buckets the store holds, for tests and metrics.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nbuckets
}
