package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/edge"
	"github.com/ratecord/ratecord/store/internal/model"
	"github.com/ratecord/ratecord/store/memstore"
)

// ErrUnavailable means Redis could not be reached or answered in a way the
// Store does not understand. Under [FailClosed], Acquire returns a
// *[store.WaitError] whose error wraps both ErrUnavailable and the cause;
// Update returns such an error under either policy.
var ErrUnavailable = errors.New("redisstore: redis unavailable")

// Store is a [store.Store] that keeps rate-limit state in Redis, shared by
// every process that uses the same server (or cluster) and key prefix.
// Create one with [New]; the zero value is not usable. It is safe for
// concurrent use.
type Store struct {
	mu       sync.Mutex          // guards sessions, byTag, routes, refusal, aging, closed, probing and the fields up to span
	sessions map[string]*session // credential -> what the Store knows and does for it
	byTag    map[string]*session // the credential's hash tag -> its session, for pushes
	routes   aged[routeFacts]    // credential NUL route -> its hash, longest window and limit (cache.go)
	refusal  aged[refusal]       // credential (NUL major, for webhooks) -> a cooldown Redis reported
	aging    *time.Timer         // ages routes and refusal while they hold anything
	ageEvery time.Duration       // agePeriod when the Store was made
	closed   bool
	probing  bool
	// lastRecall is the latest recall any session recorded, in Unix
	// nanoseconds (see recall.go); read without the lock.
	lastRecall atomic.Int64
	swept      time.Time // the last sweep of idle sessions

	// What the hold-off after a fallback and the grace period after a
	// recovery need to know (see failsafe.go).
	fellAt     time.Time     // the last switch to the local limiter
	back       chan struct{} // closed when the Store limits through Redis again (nil: it does)
	graceUntil time.Time     // the end of the grace period
	longest    time.Duration // the longest window or pause seen on any route
	span       time.Duration // the longest global span of a claim

	out struct {
		queued  atomic.Int64  // reports waiting to be applied, every session's
		dropped atomic.Uint64 // reports never applied
	}

	client     redis.UniversalClient
	prefix     string
	policy     FailurePolicy
	share      int
	log        *slog.Logger
	onFallback func(error)

	pendingTimeout time.Duration
	pushWait       time.Duration
	grace          time.Duration
	probeEvery     time.Duration
	maxBatch       int
	leaseMax       int
	callTimeout    time.Duration
	outboxLimit    int

	id     string          // random, unique to this Store: its permits, its channel, its tickets
	calls  atomic.Uint64   // numbers the calls and the reports, in order for each credential, whatever session makes them
	ctx    context.Context // canceled by Close; bounds every Redis call of the drivers
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup // drivers, the prober, the notes' follower, the guard

	local    *memstore.Store
	pol      store.Policy // normalized
	gates    *edge.Gates  // Cloudflare blocks, shared through Redis (edge.go)
	watching atomic.Bool  // the channels are followed (notes.go)
	degraded atomic.Bool
	stalled  atomic.Int32 // calls that outlasted the call timeout and have not returned

	// subscribed is closed when the subscription to the Store's own
	// channel is first confirmed; subWaited is set once a driver has
	// waited for that (see awaitSubscription).
	subscribed chan struct{}
	subOnce    sync.Once
	subWaited  atomic.Bool

	invalid      invalidGuard
	invalidGroup string

	// clock, when set, is the time the scripts use instead of Redis TIME
	// (tests drive the scripts with a fake clock).
	clock func() time.Time

	fallbacks   atomic.Uint64
	recoveries  atomic.Uint64
	errs        atomic.Uint64
	localGrants atomic.Uint64
	stalls      atomic.Uint64
	descheduled atomic.Uint64
	resyncs     atomic.Uint64 // times every queue was made to ask again (resync)

	freezes *freezeWatch // tells a Redis stall from this process not running (freeze.go)
}

var _ store.Store = (*Store)(nil)

const (
	// bucketTTL is how long a bucket's state outlives its reset and pauses.
	bucketTTL = 10 * time.Minute
	// routeTTL is how long a learned route -> bucket mapping outlives its
	// last use.
	routeTTL = time.Hour
)

// New returns a Store that keeps its state in Redis through client: a
// [redis.Client], a [redis.Ring] or a [redis.ClusterClient]. The Store does
// not own client: Close leaves it open. New does no I/O and starts no
// goroutine: the first Acquire starts the driver of its credential and
// follows the Store's channels; see [Store.Close].
func New(client redis.UniversalClient, opts ...Option) *Store {
	var id [8]byte
	_, _ = rand.Read(id[:])
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		sessions:       make(map[string]*session),
		byTag:          make(map[string]*session),
		client:         client,
		prefix:         DefaultPrefix,
		policy:         FailOpen,
		share:          DefaultLocalShare,
		log:            slog.New(slog.DiscardHandler),
		pendingTimeout: DefaultPendingTimeout,
		pushWait:       DefaultPushWait,
		grace:          DefaultTicketGrace,
		probeEvery:     DefaultProbeInterval,
		ageEvery:       agePeriod,
		maxBatch:       DefaultMaxBatch,
		leaseMax:       DefaultLease,
		callTimeout:    DefaultCallTimeout,
		outboxLimit:    DefaultOutboxLimit,
		id:             hex.EncodeToString(id[:]),
		ctx:            ctx,
		cancel:         cancel,
		done:           make(chan struct{}),
		subscribed:     make(chan struct{}),
		freezes:        newFreezeWatch(nil),
	}
	s.invalid.kick = make(chan struct{}, 1)
	for _, o := range opts {
		if o != nil {
			o.apply(s)
		}
	}
	s.pol = s.pol.Normalize()
	s.local = memstore.New(memstore.WithPolicy(s.pol))
	s.gates = edge.New(clock.Real{}, s.pol.BlockPause, s.pol.BlockPauseMax, s.id, edgeRemote{s}, s.ctx, s.callTimeout)
	s.gates.SetOffset(s.pol.ResetOffset)
	return s
}

// Stats counts what the failure policy did.
type Stats struct {
	// Errors is the number of Redis calls that failed.
	Errors uint64
	// Fallbacks is the number of switches to the local limiter.
	Fallbacks uint64
	// Recoveries is the number of returns from the local limiter to Redis.
	Recoveries uint64
	// LocalGrants is the number of requests the local limiter granted.
	LocalGrants uint64
	// Local reports whether the Store currently uses its local limiter.
	Local bool
	// Grace reports whether the Store is in the grace period after a
	// return to Redis, when a request needs a grant of the local limiter
	// as well.
	Grace bool
	// Stalls is the number of Redis calls that did not answer within the
	// call timeout ([WithCallTimeout]) of time in which this process ran.
	Stalls uint64
	// Descheduled is the number of times a Redis call was given more time,
	// or made again, because this process did not run for part of it
	// (stopped, starved of CPU, paused by its VM): such a call is not
	// taken for a Redis stall.
	Descheduled uint64
	// Queued is the number of reports waiting to be applied in Redis.
	Queued int
	// Dropped is the number of reports never applied: dropped oldest first
	// when a credential's reports filled the outbox ([WithOutboxLimit]),
	// rejected by Redis, or left when the Store closed.
	Dropped uint64
}

// Stats returns the Store's counters. It is safe for concurrent use.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	grace := s.inGrace(time.Now())
	s.mu.Unlock()
	return Stats{
		Errors:      s.errs.Load(),
		Fallbacks:   s.fallbacks.Load(),
		Recoveries:  s.recoveries.Load(),
		LocalGrants: s.localGrants.Load(),
		Local:       s.degraded.Load(),
		Grace:       grace,
		Stalls:      s.stalls.Load(),
		Descheduled: s.descheduled.Load(),
		Queued:      int(s.out.queued.Load()),
		Dropped:     s.out.dropped.Load(),
	}
}

// Fallbacks returns how many times the Store switched to its local limiter
// because Redis could not be reached ([Stats].Fallbacks; the requests it
// granted locally are [Stats].LocalGrants). It implements
// ratecord.FallbackCounter, so a transport using the Store reports it as
// its store fallbacks metric. It is zero under [FailClosed] and safe for
// concurrent use.
func (s *Store) Fallbacks() uint64 { return s.fallbacks.Load() }

// Acquire implements [store.Store]. Waiters queue in this process in a
// FIFO per (credential, route, major), in two lanes; the credential's
// driver asks Redis for slots on behalf of the waiters at the front of
// every queue whose turn may have come, in one call. A wait whose end
// this process already knows (a reset, a pause, its place in a line) is
// not asked about again before it ends: a claim that cannot wait that
// long fails without a Redis command. During the grace period that
// follows a return to Redis, the request takes a grant of the local
// limiter first.
//
// A Cloudflare block holds a claim before its bucket does: the blocks are
// shared by every process of the store through one Redis hash and a
// channel, which the Store follows from its first Acquire on.
func (s *Store) Acquire(ctx context.Context, c store.Claim) (*store.Reservation, error) {
	if !s.watching.Load() {
		s.watch()
	}
	return s.gates.Acquire(ctx, c, time.Now(), s.done, func(c store.Claim) (*store.Reservation, error) {
		g, err := s.acquire(ctx, c)
		if err != nil {
			return nil, err
		}
		r := store.NewReservation(s, c, g.Bucket, g.Waited, g.Handle, 0)
		switch h := g.Handle.(type) {
		case *permit:
			r.SendBy = h.sendBy
			if h.local != nil && !h.local.SendBy.IsZero() && (r.SendBy.IsZero() || h.local.SendBy.Before(r.SendBy)) {
				r.SendBy = h.local.SendBy
			}
		case *localPermit:
			r.SendBy = h.p.SendBy
		}
		return r, nil
	})
}

// Lapsed implements [store.Lapser]: a grant through Redis lapses half the
// hold after the call that granted it left (or after the slot it
// reserved opens), or once a response that reached any process spent its
// bucket (see recall.go); one of the local limiter on its terms.
func (s *Store) Lapsed(r *store.Reservation) bool {
	handle, _ := r.Handle()
	switch h := handle.(type) {
	case *permit:
		return !h.sendBy.IsZero() && time.Now().After(h.sendBy) || h.local != nil && h.local.Lapsed() || s.recalled(h)
	case *localPermit:
		return h.p.Lapsed()
	}
	return false
}

// BlockedFor implements [store.BlockGate]: the Store holds Cloudflare
// blocks for every credential of every process that shares it.
func (s *Store) BlockedFor(route string) time.Duration { return s.gates.Estimate(route) }

// Holding implements [store.BlockGate].
func (s *Store) Holding(r *store.Reservation) bool { return s.gates.Holding(r) }

// grant is a slot the Store granted, before it becomes a reservation.
type grant struct {
	Bucket string
	Waited time.Duration
	Handle any // *permit or *localPermit
}

func (s *Store) acquire(ctx context.Context, c store.Claim) (grant, error) {
	if err := ctx.Err(); err != nil {
		return grant{}, &store.WaitError{Err: err}
	}
	select {
	case <-c.Done:
		return grant{}, &store.WaitError{Err: store.ErrClosed}
	default:
	}
	if err := s.refuseInvalid(&c); err != nil {
		return grant{}, err
	}
	if err := s.refuseKnown(&c); err != nil {
		return grant{}, err
	}
	return s.claim(ctx, c, time.Now(), nil)
}

// claim grants c through Redis, begun at start. local, when not nil, is
// the local limiter's grant that c holds already (see acquireLocal): c
// needs both. Without one, c needs only Redis, but the local limiter's
// alone while the Store limits locally, and both during the grace period
// after a return to Redis.
func (s *Store) claim(ctx context.Context, c store.Claim, start time.Time, local *store.Reservation) (grant, error) {
	if local == nil && s.degraded.Load() {
		return s.acquireLocal(ctx, c, start)
	}
	s.mu.Lock()
	if c.Global {
		s.span = max(s.span, s.globalSpan())
	}
	grace := s.inGrace(start)
	s.mu.Unlock()
	if grace && local == nil {
		p, err := s.localGrant(ctx, c)
		if err != nil {
			return grant{}, err
		}
		local = p
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.giveBackLocal(local)
		return grant{}, &store.WaitError{Err: store.ErrClosed}
	}
	ss := s.session(c.Credential)
	q := ss.queue(qkey{route: c.Route, major: c.Major, kind: c.Kind})
	q.lastUse = start
	if local == nil {
		if p, ok := q.leased(&c, start); ok {
			s.mu.Unlock()
			return p, nil
		}
	}
	if s.policy == FailClosed && s.stalled.Load() > 0 {
		// A call did not answer in time and has not yet.
		s.mu.Unlock()
		s.giveBackLocal(local)
		return grant{}, unavailable("claim", errStalled)
	}
	if werr := s.knownWait(ctx, ss, q, &c, start); werr != nil {
		q.missed = start
		s.mu.Unlock()
		s.giveBackLocal(local)
		return grant{}, werr
	}
	w := &waiter{claim: c, ready: make(chan struct{}), start: start, local: local}
	if dl, ok := ctx.Deadline(); ok {
		w.deadline = dl
	}
	if c.Priority == store.PriorityUrgent && !q.urgent {
		// The queue's place was taken for the normal lane: an urgent
		// waiter claims at once, for a place ahead of them.
		q.turn = start
	}
	q.add(w)
	if ss.ready(q, start) {
		ss.kick()
	}
	s.mu.Unlock()
	return s.wait(ctx, ss, q, w)
}

// knownWait returns the refusal of c when this process already knows that
// its wait lasts longer than c accepts: its queue's last claim was told
// the wait lasts until a moment that comes after c's deadline or MaxWait,
// or c will not wait at all (NoWait) while requests of this process wait
// ahead of it or the queue's turn has not come. It costs no Redis command.
// s.mu must be held.
func (s *Store) knownWait(ctx context.Context, ss *session, q *lqueue, c *store.Claim, now time.Time) *store.WaitError {
	if c.Priority == store.PriorityUrgent && !q.urgent {
		// What the queue knows is the normal lane's turn.
		return nil
	}
	bound, scope := q.boundFrom(now), q.scope
	if c.Global && ss.gateBound.After(now) && ss.gateBound.Sub(now) > bound {
		bound, scope = ss.gateBound.Sub(now), store.ScopeGlobal
	}
	turn := q.notBefore.After(now) || c.Global && ss.gate.After(now)
	if c.NoWait && (len(q.waiters) > 0 || turn || bound > 0) {
		est := bound
		if est == 0 && turn {
			est = max(q.notBefore.Sub(now), 0)
			if c.Global && ss.gate.Sub(now) > est {
				est = ss.gate.Sub(now)
			}
		}
		werr := &store.WaitError{Bucket: q.hash, Scope: scope, RetryAfter: est, Err: store.ErrWaitTooLong}
		if err := store.CheckWait(ctx, c, now, est); err != nil {
			werr.Err = err
		}
		return werr
	}
	if bound > 0 {
		if err := store.CheckWait(ctx, c, now, bound); err != nil {
			return &store.WaitError{Bucket: q.hash, Scope: scope, RetryAfter: bound, Err: err}
		}
	}
	return nil
}

// wait blocks until the driver settles w or the waiter gives up, then,
// for a slot reserved for later, until the slot opens.
func (s *Store) wait(ctx context.Context, ss *session, q *lqueue, w *waiter) (grant, error) {
	var expired <-chan time.Time
	if w.claim.MaxWait > 0 {
		t := time.NewTimer(w.claim.MaxWait)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-w.ready:
		g, err := s.settled(ctx, w)
		if err != nil || w.at.IsZero() {
			return g, err
		}
		return s.reserved(ctx, w, g, expired)
	case <-ctx.Done():
		err = ctx.Err()
	case <-w.claim.Done:
		err = store.ErrClosed
	case <-s.done:
		err = store.ErrClosed
	case <-expired:
		err = store.ErrWaitTooLong
	}

	now := time.Now()
	s.mu.Lock()
	werr := &store.WaitError{Bucket: q.hash, Scope: q.scope, Err: err}
	if !s.closed {
		werr.RetryAfter = q.boundFrom(now)
	}
	if w.state != waiting {
		// The driver settled w while it gave up. A slot it may use now
		// stays with the queue a moment, for the next waiter (a caller
		// that retries at once); the rest goes back.
		kept := w.state == granted && w.at.IsZero() && w.local == nil && !s.closed && s.keepSlot(q, &w.claim, w.permit, now)
		if kept {
			ss.kick() // its driver gives it back if nobody takes it
		}
		s.mu.Unlock()
		if w.state == granted && !kept {
			s.giveBack(w.permit)
		}
		s.giveBackLocal(w.local)
		return grant{}, werr
	}
	w.state = abandoned
	q.remove(w)
	if err != store.ErrClosed {
		q.missed = now
	}
	s.mu.Unlock()
	s.giveBackLocal(w.local)
	return grant{}, werr
}

// reserved waits until the slot reserved for w opens; the global window
// is full until then. A waiter that gives up first gives the slot back.
func (s *Store) reserved(ctx context.Context, w *waiter, g grant, expired <-chan time.Time) (grant, error) {
	d := time.Until(w.at)
	if d <= 0 {
		return g, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	var err error
	select {
	case <-t.C:
		g.Waited = time.Since(w.start)
		return g, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-w.claim.Done:
		err = store.ErrClosed
	case <-s.done:
		err = store.ErrClosed
	case <-expired:
		err = store.ErrWaitTooLong
	}
	s.giveBack(g)
	return grant{}, &store.WaitError{Bucket: g.Bucket, Scope: store.ScopeGlobal, RetryAfter: max(time.Until(w.at), 0), Err: err}
}

// settled returns what the driver decided for w.
func (s *Store) settled(ctx context.Context, w *waiter) (grant, error) {
	switch w.state {
	case granted:
		if h, ok := w.permit.Handle.(*permit); ok {
			h.local = w.local
		}
		w.permit.Waited = time.Since(w.start)
		return w.permit, nil
	case handedOver:
		if w.local != nil {
			return s.localOnly(ctx, w.claim, w.start, w.local)
		}
		return s.acquireLocal(ctx, w.claim, w.start)
	default:
		s.giveBackLocal(w.local)
		return grant{}, w.err
	}
}

// giveBack returns a permit nobody will use.
func (s *Store) giveBack(p grant) {
	h, ok := p.Handle.(*permit)
	if !ok {
		return
	}
	s.giveBackLocal(h.local)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.enqueueLocked(s.session(h.cred), h, store.Update{}, time.Now())
}

// giveBackLocked returns a permit of ss nobody will use; s.mu must be
// held.
func (s *Store) giveBackLocked(ss *session, p grant) {
	h, ok := p.Handle.(*permit)
	if !ok {
		return
	}
	if h.local != nil {
		// The local limiter takes its own lock: not under s.mu.
		go h.local.Cancel()
	}
	s.enqueueLocked(ss, h, store.Update{}, time.Now())
}

// permit is the Handle of a permit granted through Redis.
type permit struct {
	lent               bool // kept in a queue's lease, not handed to a caller yet; guarded by Store.mu
	cred, route, major string
	sub                string // the claim's Kind
	kind               int
	hash               string // the learned hash, for kindLearned
	member             string // the permit's id in the global window: the claim's prefix and a number
	global, tokenAuth  bool
	limit              int64              // the granting bucket's limit when granted, 0 when unknown
	local              *store.Reservation // the local limiter's grant too, during a grace period
	// sendBy is when the grant lapses (see [store.Reservation.SendBy]):
	// half the hold after the call that granted it left, or after the
	// slot it reserved opens.
	sendBy time.Time
	// line names its counter (the queue's line), and granted is when the
	// call that granted it left: a recall of the line from then on takes
	// it back (see recall.go).
	line    string
	granted time.Time
}

// localPermit is the Handle of a permit granted by the local limiter.
type localPermit struct{ p *store.Reservation }

// Settle implements [store.Settler]: [store.Reservation.Report] and
// [store.Reservation.Cancel] call it. It never waits for Redis: the report
// of a permit granted through Redis joins its credential's session, whose
// driver carries it to Redis with its next claim, or alone once it is due
// (at once for a 429 or when another process waits for the bucket, within
// 20 ms otherwise), in order, even when ctx is done. Permits granted by
// the local limiter go back to it at once. Settle returns
// [store.ErrClosed] after Close, and otherwise nil: reports that Redis
// cannot take yet stay queued (see [WithOutboxLimit]).
func (s *Store) Settle(ctx context.Context, r *store.Reservation, u store.Update) error {
	c := &r.Claim
	handle, _ := r.Handle()
	s.gates.Settle(r, c, &u)
	now := time.Now()
	s.mu.Lock()
	closed := s.closed
	var window time.Duration
	if !closed {
		window = s.noteWindow(c, &u)
	}
	s.mu.Unlock()
	if closed {
		return store.ErrClosed
	}
	if u.Sent && model.Invalid(int64(u.Status), string(u.Scope)) {
		s.countInvalid()
	}
	switch h := handle.(type) {
	case *localPermit:
		err := h.p.Report(ctx, s.localUpdate(u, window))
		if u.Sent && (u.HasLimit || u.Status == 429) {
			// Redis has not seen this response, and the other processes
			// know nothing of the window it dates (an empty Redis after a
			// restart least of all): it waits in the outbox, without a
			// permit of Redis's, and goes once Redis is back.
			s.mu.Lock()
			if !s.closed {
				s.enqueueLocked(s.session(c.Credential), &permit{cred: c.Credential, route: c.Route, major: c.Major,
					kind: kindNoPermit, tokenAuth: c.TokenAuth}, u, now)
			}
			s.mu.Unlock()
		}
		return err
	case *permit:
		if h.local != nil {
			_ = h.local.Report(ctx, s.localUpdate(u, window))
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.closed {
			return store.ErrClosed
		}
		ss := s.session(h.cred)
		s.enqueueLocked(ss, h, u, now)
		s.revokeLease(ss, h, &u)
		s.recallOwn(ss, h, &u, now)
		return nil
	default:
		return nil // not issued by this Store
	}
}

// enqueueLocked queues the report u of permit h in ss, received at at, and
// decides when it goes: with the claim of a local queue that waits for it,
// within urgentDelay when other processes may wait for it (a 429, a limit
// lowered, a bucket spent), or within flushDelay. s.mu must be held.
func (s *Store) enqueueLocked(ss *session, h *permit, u store.Update, at time.Time) {
	ss.reports = append(ss.reports, &update{seq: s.calls.Add(1), h: h, u: u, at: at})
	s.out.queued.Add(1)
	if len(ss.reports) > s.outboxLimit {
		n := len(ss.reports) - s.outboxLimit
		clear(ss.reports[:n])
		ss.reports = ss.reports[n:]
		s.out.queued.Add(-int64(n))
		s.out.dropped.Add(uint64(n))
		s.log.LogAttrs(context.Background(), slogWarn, "ratecord: report outbox full, oldest report dropped",
			slog.Int("limit", s.outboxLimit))
	}
	due := at.Add(reportDelay(h, &u))
	gid := bucketID(h.kind, h.hash, h.route, h.major)
	for _, q := range ss.queues {
		if q.line != gid && (q.key.route != h.route || q.key.major != h.major) {
			continue
		}
		// What this process knew of the bucket's wait may end with this
		// report: a slot given back, a response that a queue waits for,
		// a limit raised. A queue waiting for it claims at once, carrying
		// the report; what a report does not change stays known.
		if u.Sent && !q.push && !(u.HasLimit && int64(u.Limit) > h.limit) {
			continue
		}
		if len(q.waiters) > 0 && q.notBefore.After(at) {
			due = at
		}
		q.notBefore, q.bound = time.Time{}, time.Time{}
	}
	if h.global && !u.Sent {
		// A global slot given back: the gate may open.
		ss.gate, ss.gateBound = time.Time{}, time.Time{}
		due = at
	}
	if ss.flushAt.IsZero() || due.Before(ss.flushAt) {
		ss.flushAt = due
		ss.kick()
	}
	if !ss.running {
		ss.running = true
		s.wg.Add(1)
		go s.drive(ss)
	}
}

// reportDelay returns how long the report u of permit h may wait for a
// claim of its credential to carry it. A 429, a limit lowered, a slot
// given back or a bucket spent goes at once: other processes must not
// send on what they no longer have, may use what came back, and wait for
// what answered (a window refills, a sliding window drips, only once the
// requests in it are reported). Others wait up to flushDelay.
func reportDelay(h *permit, u *store.Update) time.Duration {
	if u.Status == 429 || !u.Sent || u.HasLimit && (u.Remaining == 0 || int64(u.Limit) < h.limit) {
		return urgentDelay
	}
	return flushDelay
}

// refusal is a cooldown that Redis reported (a 401 or a gone webhook), kept
// so that the process refuses the next requests without asking again.
type refusal struct {
	until time.Time
	err   *store.WaitError
}

// refusedLocked remembers a cooldown Redis reported for key; s.mu must be
// held.
func (s *Store) refusedLocked(key string, err *store.WaitError) {
	if err.RetryAfter <= 0 {
		return
	}
	s.refusal.put(key, refusal{until: time.Now().Add(err.RetryAfter), err: err})
	s.remember()
}

// refuseKnown refuses c while a cooldown reported for its credential (or
// its webhook) lasts, without a round trip.
func (s *Store) refuseKnown(c *store.Claim) error {
	key := c.Credential
	if c.TokenAuth {
		key += "\x00" + c.Major
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.refusal.get(key)
	if !ok {
		return nil
	}
	now := time.Now()
	if !now.Before(r.until) {
		s.refusal.del(key)
		return nil
	}
	return &store.WaitError{Scope: r.err.Scope, RetryAfter: r.until.Sub(now), Err: r.err.Err}
}

// learnLocked records in the process-local cache what u taught about its
// route, so that the next claim names the right keys at once; s.mu must be
// held.
func (s *Store) learnLocked(h *permit, u store.Update) {
	if !u.Sent {
		return
	}
	var hash string
	switch {
	case u.Bucket != "":
		hash = u.Bucket
	case u.Status >= 200 && u.Status < 300 && !u.HasLimit:
		hash = noBucket
	default:
		return
	}
	key := h.cred + "\x00" + h.route
	if old := s.guess(key); old == hash || hash == noBucket && old != "" {
		return
	}
	s.setGuess(key, hash)
}

// guess returns the cached hash of the route named by key (credential NUL
// route): "" when unknown. s.mu must be held.
func (s *Store) guess(key string) string {
	f, _ := s.routes.get(key)
	return f.hash
}

// setGuess caches a route's hash; s.mu must be held.
func (s *Store) setGuess(key, hash string) {
	f, _ := s.routes.peek(key)
	f.hash = hash
	s.routes.put(key, f)
	s.remember()
}

// Close implements [store.Store]: it releases every waiter with
// [store.ErrClosed], stops the Store's goroutines and waits for them, then
// writes what it can of the reports within twice the call timeout and
// drops the rest, logging how many. With a client that ignores context
// deadlines (go-redis without ContextTimeoutEnabled), Close may also wait
// for a call in flight until the client's own timeouts end it. It does not
// close the Redis client. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.cancel()
	if s.aging != nil {
		s.aging.Stop()
		s.aging = nil
	}
	for _, ss := range s.sessions {
		for _, q := range ss.queues {
			for _, w := range q.waiters {
				w.err = &store.WaitError{Err: store.ErrClosed}
				q.settle(w, failed)
			}
			q.waiters = nil
		}
	}
	s.mu.Unlock()
	s.gates.Close()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.callTimeout)
	s.flush(ctx)
	cancel()
	return s.local.Close()
}

// flush writes what it can of every session's reports and leases before
// ctx ends, then drops the rest with a logged count. Close calls it once
// no other goroutine of the Store runs.
func (s *Store) flush(ctx context.Context) {
	s.mu.Lock()
	var all []*session
	for _, ss := range s.sessions {
		for _, q := range ss.queues {
			for _, p := range q.takeLease() {
				if h, ok := p.Handle.(*permit); ok {
					ss.reports = append(ss.reports, &update{seq: s.calls.Add(1), h: h, at: time.Now()})
					s.out.queued.Add(1)
				}
			}
		}
		if len(ss.reports) > 0 || len(ss.lost) > 0 {
			all = append(all, ss)
		}
	}
	s.mu.Unlock()
	dropped := 0
	for _, ss := range all {
		for ctx.Err() == nil {
			s.mu.Lock()
			p := plan{lost: ss.lost, reports: append([]*update(nil), ss.reports[:min(len(ss.reports), maxReports)]...), glimit: ss.glimit}
			if p.empty() {
				s.mu.Unlock()
				break
			}
			p.no = s.calls.Add(1)
			s.mu.Unlock()
			var st step
			for _, c := range p.lost {
				st.undoCall(s, ss.keys, c)
			}
			sentAt := time.Now()
			for _, it := range p.reports {
				st.report(s, ss.keys, it.h, &it.u, it.seq, millisDown(sentAt.Sub(it.at)))
			}
			st.build(s, ss.keys, ss.tag, p.no, p.glimit)
			cctx, cancel := context.WithTimeout(ctx, s.callTimeout)
			v, err := st.run(cctx, s).Result()
			cancel()
			if err == nil {
				_, err = parseStep(v, len(p.reports), 0)
			}
			if err != nil {
				break
			}
			s.mu.Lock()
			ss.lost = nil
			s.removeReports(ss, p.reports)
			s.mu.Unlock()
		}
		s.mu.Lock()
		dropped += len(ss.reports)
		s.removeReports(ss, append([]*update(nil), ss.reports...))
		s.mu.Unlock()
	}
	if dropped > 0 {
		s.out.dropped.Add(uint64(dropped))
		s.log.LogAttrs(context.Background(), slogWarn, "ratecord: closing with reports redis did not take, dropped",
			slog.Int("reports", dropped))
	}
}

func flag(b bool) int {
	if b {
		return 1
	}
	return 0
}

// millis converts d to whole milliseconds, rounding up.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// clockArg is the scripts' last argument: the time in milliseconds they
// use, or 0 for Redis TIME.
func (s *Store) clockArg() int64 {
	if s.clock == nil {
		return 0
	}
	return s.clock().UnixMilli()
}
