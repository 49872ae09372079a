package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"strconv"
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
	mu      sync.Mutex // guards queues, byCred, guesses, closed, probing and the fields up to span
	queues  map[qkey]*lqueue
	byCred  map[string]map[*lqueue]struct{}
	guesses map[string]string  // credential NUL route -> last known hash
	refusal map[string]refusal // credential (NUL major, for webhooks) -> a cooldown Redis reported
	closed  bool
	probing bool

	// What the hold-off after a fallback and the grace period after a
	// recovery need to know (see failsafe.go).
	fellAt     time.Time                // the last switch to the local limiter
	graceUntil time.Time                // the end of the grace period
	windows    map[string]time.Duration // credential NUL route -> longest window or pause seen
	longest    time.Duration            // the longest of windows
	span       time.Duration            // the longest global span of a claim

	out outbox // updates on their way to Redis

	client     redis.UniversalClient
	prefix     string
	policy     FailurePolicy
	share      int
	log        *slog.Logger
	onFallback func(error)

	pendingTimeout time.Duration
	poll           time.Duration
	probeEvery     time.Duration
	maxBatch       int
	leaseMax       int
	callTimeout    time.Duration
	outboxLimit    int

	id     string // random, unique to this Store: prefixes permit and queue ids
	seq    atomic.Uint64
	ctx    context.Context // canceled by Close; bounds every Redis call of the drivers and the writer
	cancel context.CancelFunc
	done   chan struct{}
	wg     sync.WaitGroup // drivers, the prober and the writer

	local    *memstore.Store
	pol      store.Policy // normalized
	gates    *edge.Gates  // Cloudflare blocks, shared through Redis (edge.go)
	watching atomic.Bool  // the gates' channel is followed
	degraded atomic.Bool

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
}

var _ store.Store = (*Store)(nil)

const (
	// bucketTTL is how long a bucket's state outlives its reset and pauses.
	bucketTTL = 10 * time.Minute
	// routeTTL is how long a learned route -> bucket mapping outlives its
	// last use.
	routeTTL = time.Hour
	// maxGuesses bounds the process-local cache of learned routes.
	maxGuesses = 1 << 16
	// wakeSlack is how much earlier than planned a queue must be able to go
	// for an Update to wake it.
	wakeSlack = 2 * time.Millisecond
)

// New returns a Store that keeps its state in Redis through client: a
// [redis.Client], a [redis.Ring] or a [redis.ClusterClient]. The Store does
// not own client: Close leaves it open. New does no I/O and starts no
// goroutine: the first Acquire starts a queue's driver, the first Update
// the writer of the outbox; see [Store.Close].
func New(client redis.UniversalClient, opts ...Option) *Store {
	var id [8]byte
	_, _ = rand.Read(id[:])
	ctx, cancel := context.WithCancel(context.Background())
	s := &Store{
		queues:         make(map[qkey]*lqueue),
		byCred:         make(map[string]map[*lqueue]struct{}),
		guesses:        make(map[string]string),
		refusal:        make(map[string]refusal),
		windows:        make(map[string]time.Duration),
		out:            newOutbox(),
		client:         client,
		prefix:         DefaultPrefix,
		policy:         FailOpen,
		share:          DefaultLocalShare,
		log:            slog.New(slog.DiscardHandler),
		pendingTimeout: DefaultPendingTimeout,
		poll:           DefaultPollInterval,
		probeEvery:     DefaultProbeInterval,
		maxBatch:       DefaultMaxBatch,
		leaseMax:       DefaultLease,
		callTimeout:    DefaultCallTimeout,
		outboxLimit:    DefaultOutboxLimit,
		id:             hex.EncodeToString(id[:]),
		ctx:            ctx,
		cancel:         cancel,
		done:           make(chan struct{}),
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
	// call timeout ([WithCallTimeout]).
	Stalls uint64
	// Queued is the number of updates waiting to be written to Redis.
	Queued int
	// Dropped is the number of updates never written: dropped oldest first
	// when the outbox was full ([WithOutboxLimit]), rejected by Redis, or
	// left when the Store closed.
	Dropped uint64
}

// Stats returns the Store's counters. It is safe for concurrent use.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	grace := s.inGrace(time.Now())
	s.mu.Unlock()
	s.out.mu.Lock()
	queued, dropped := len(s.out.items), s.out.dropped
	s.out.mu.Unlock()
	return Stats{
		Errors:      s.errs.Load(),
		Fallbacks:   s.fallbacks.Load(),
		Recoveries:  s.recoveries.Load(),
		LocalGrants: s.localGrants.Load(),
		Local:       s.degraded.Load(),
		Grace:       grace,
		Stalls:      s.stalls.Load(),
		Queued:      queued,
		Dropped:     dropped,
	}
}

// Fallbacks returns how many times the Store switched to its local limiter
// because Redis could not be reached ([Stats].Fallbacks; the requests it
// granted locally are [Stats].LocalGrants). It implements
// ratecord.FallbackCounter, so a transport using the Store reports it as
// its store fallbacks metric. It is zero under [FailClosed] and safe for
// concurrent use.
func (s *Store) Fallbacks() uint64 { return s.fallbacks.Load() }

// Acquire implements [store.Store]. Waiters queue in a FIFO per
// (credential, route, major) in this process; the queue's driver asks Redis
// for slots on behalf of the waiters at its front. During the grace period
// that follows a return to Redis, the request takes a grant of the local
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
		return store.NewReservation(s, c, g.Bucket, g.Waited, g.Handle, 0), nil
	})
}

// BlockedFor implements [store.BlockGate]: the Store holds Cloudflare
// blocks for every credential of every process that shares it.
func (s *Store) BlockedFor(route string) time.Duration { return s.gates.Estimate(route) }

// Holding implements [store.BlockGate].
func (s *Store) Holding(r *store.Reservation) bool { return s.gates.Holding(r) }

// watch starts following the gates' channel, once.
func (s *Store) watch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.watching.Load() {
		return
	}
	s.watching.Store(true)
	s.wg.Add(1)
	go s.watchGates()
}

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
	start := time.Now()
	if s.degraded.Load() {
		return s.acquireLocal(ctx, c, start)
	}
	s.mu.Lock()
	if c.Global {
		s.span = max(s.span, s.globalSpan())
	}
	grace := s.inGrace(start)
	s.mu.Unlock()
	var local *store.Reservation
	if grace {
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
	q := s.queue(qkey{cred: c.Credential, route: c.Route, major: c.Major, kind: c.Kind})
	if local == nil {
		if p, ok := q.leased(&c, start); ok {
			s.mu.Unlock()
			return p, nil
		}
	}
	if q.stalled && s.policy == FailClosed {
		// The queue's last call did not answer in time and has not yet.
		s.mu.Unlock()
		s.giveBackLocal(local)
		return grant{}, unavailable("claim", errStalled)
	}
	if c.NoWait && len(q.waiters) > 0 {
		// Requests of this process are queued ahead of it.
		werr := &store.WaitError{Bucket: q.hash, Scope: q.scope, RetryAfter: q.boundFrom(start), Err: store.ErrWaitTooLong}
		if err := store.CheckWait(ctx, &c, start, werr.RetryAfter); err != nil {
			werr.Err = err
		}
		s.mu.Unlock()
		s.giveBackLocal(local)
		return grant{}, werr
	}
	w := &waiter{claim: c, ready: make(chan struct{}), start: start, local: local}
	if dl, ok := ctx.Deadline(); ok {
		w.deadline = dl
	}
	q.add(w)
	if q.idle {
		q.idle = false
		q.kick()
	}
	if wait := q.boundFrom(start); wait > 0 && store.CheckWait(ctx, &c, start, wait) != nil {
		// The last known wait outlasts this waiter: let the driver check
		// again now, so that it fails at once if that still holds.
		q.kick()
	}
	s.mu.Unlock()
	return s.wait(ctx, q, w)
}

// wait blocks until the driver settles w or the waiter gives up.
func (s *Store) wait(ctx context.Context, q *lqueue, w *waiter) (grant, error) {
	var expired <-chan time.Time
	if w.claim.MaxWait > 0 {
		t := time.NewTimer(w.claim.MaxWait)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-w.ready:
		return s.settled(ctx, w)
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
		// The driver settled w while it gave up: give back what it got.
		s.mu.Unlock()
		if w.state == granted {
			s.giveBack(w.permit)
		}
		s.giveBackLocal(w.local)
		return grant{}, werr
	}
	w.state = abandoned
	q.remove(w)
	s.mu.Unlock()
	q.kick()
	s.giveBackLocal(w.local)
	return grant{}, werr
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
			s.localGrants.Add(1)
			return grant{Bucket: w.local.Bucket, Waited: time.Since(w.start), Handle: &localPermit{p: w.local}}, nil
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
	_ = s.enqueue(h, store.Update{})
}

// permit is the Handle of a permit granted through Redis.
type permit struct {
	lent               bool   // kept in a queue's lease, not handed to a caller yet; guarded by Store.mu
	qid                string // for the slots of a claim whose reply was lost: the queue that claimed
	cred, route, major string
	sub                string // the claim's Kind
	kind               int
	hash               string // the learned hash, for kindLearned
	member             string // the permit's id in the global set: the claim's prefix and a number
	global, tokenAuth  bool
	limit              int64              // the granting bucket's limit when granted, 0 when unknown
	local              *store.Reservation // the local limiter's grant too, during a grace period
}

// localPermit is the Handle of a permit granted by the local limiter.
type localPermit struct{ p *store.Reservation }

// Settle implements [store.Settler]: [store.Reservation.Report] and
// [store.Reservation.Cancel] call it. It never waits for Redis: the update
// of a permit granted through Redis joins the Store's outbox, which a
// goroutine of the Store writes to Redis in order, several updates per
// round trip, even when ctx is done; queues of this process that wait for
// it are woken once it is written. Permits granted by the local limiter go
// back to it at once. Settle returns [store.ErrClosed] after Close, and
// otherwise nil: updates that Redis cannot take yet stay queued (see
// [WithOutboxLimit]).
func (s *Store) Settle(ctx context.Context, r *store.Reservation, u store.Update) error {
	c := &r.Claim
	handle, _ := r.Handle()
	s.gates.Settle(r, c, &u)
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.noteWindow(c, &u)
	}
	window := s.windows[c.Credential+"\x00"+c.Route]
	s.mu.Unlock()
	if closed {
		return store.ErrClosed
	}
	if u.Sent && model.Invalid(int64(u.Status), string(u.Scope)) {
		s.countInvalid()
	}
	switch h := handle.(type) {
	case *localPermit:
		return h.p.Report(ctx, s.localUpdate(u, window))
	case *permit:
		if h.local != nil {
			_ = h.local.Report(ctx, s.localUpdate(u, window))
		}
		err := s.enqueue(h, u)
		s.revokeLease(h, &u)
		return err
	default:
		return nil // not issued by this Store
	}
}

// apply adds to the pipeline p the step call that writes the updates g, all
// of one credential, in order: EVALSHA, or EVAL when eval is true.
func (s *Store) apply(ctx context.Context, p redis.Pipeliner, g []*update, eval bool) {
	var st step
	for _, it := range g {
		gid, tid := st.update(s, it.h, it.u, it.seq)
		it.bid = gid
		if it.u.Sent {
			it.bid = tid
		}
	}
	cmd := st.send(ctx, p, s.clockArg(), eval)
	for _, it := range g {
		it.cmd = cmd
	}
}

// refusal is a cooldown that Redis reported (a 401 or a gone webhook), kept
// so that the process refuses the next requests without asking again.
type refusal struct {
	until time.Time
	err   *store.WaitError
}

// refused remembers a cooldown Redis reported for key.
func (s *Store) refused(key string, err *store.WaitError) {
	if err.RetryAfter <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.refusal[key]; !ok && len(s.refusal) >= maxGuesses {
		clear(s.refusal)
	}
	s.refusal[key] = refusal{until: time.Now().Add(err.RetryAfter), err: err}
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
	r, ok := s.refusal[key]
	if !ok {
		return nil
	}
	now := time.Now()
	if !now.Before(r.until) {
		delete(s.refusal, key)
		return nil
	}
	return &store.WaitError{Scope: r.err.Scope, RetryAfter: r.until.Sub(now), Err: r.err.Err}
}

// learn records in the process-local cache what u taught about its route,
// so that the next claim names the right keys at once.
func (s *Store) learn(h *permit, u store.Update) {
	var hash string
	switch {
	case u.Bucket != "":
		hash = u.Bucket
	case u.Status >= 200 && u.Status < 300 && !u.HasLimit:
		hash = noBucket
	default:
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	key := h.cred + "\x00" + h.route
	if old, ok := s.guesses[key]; ok && (old == hash || hash == noBucket && old != "") {
		return
	}
	s.setGuess(key, hash)
}

// setGuess caches a route's hash; s.mu must be held.
func (s *Store) setGuess(key, hash string) {
	if _, ok := s.guesses[key]; !ok && len(s.guesses) >= maxGuesses {
		clear(s.guesses)
	}
	s.guesses[key] = hash
}

// wake kicks the queues of cred that wait on bucket bid and sleep past the
// moment it may grant again (wake ms from now, -1 when only another
// response can open it), and those that wait for a response on another
// bucket (the response may have moved their route).
func (s *Store) wake(cred, bid string, wake int64) {
	at := time.Now().Add(time.Duration(wake)*time.Millisecond + wakeSlack)
	s.mu.Lock()
	defer s.mu.Unlock()
	for q := range s.byCred[cred] {
		if q.bid == bid && wake >= 0 && q.sleepUntil.After(at) || q.unknown && q.bid != bid {
			q.kick()
		}
	}
}

// Close implements [store.Store]: it releases every waiter with
// [store.ErrClosed], stops the Store's goroutines and waits for them, then
// writes what it can of the outbox within twice the call timeout and drops
// the rest, logging how many. With a client that ignores context deadlines
// (go-redis without ContextTimeoutEnabled), Close may also wait for a call
// in flight until the client's own timeouts end it. It does not close the
// Redis client. Close is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.done)
	s.cancel()
	s.mu.Unlock()
	s.gates.Close()
	s.wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 2*s.callTimeout)
	s.flush(ctx)
	cancel()
	return s.local.Close()
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

func (s *Store) nextID() string {
	return s.id + ":" + strconv.FormatUint(s.seq.Add(1), 36)
}
