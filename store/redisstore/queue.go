package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/lane"
)

// qkey names a process-local queue. Claims of a kind (see
// [store.Claim].Kind) queue apart, so that a hidden sublimit that holds
// them does not hold the other requests of their bucket.
type qkey struct {
	cred, route, major, kind string
}

// queueID returns the id of the queue of k in Redis, for the Store with id.
func queueID(id string, k qkey) string {
	if k.kind != "" {
		return id + ":q" + digest(k.cred, k.route, k.major, k.kind)
	}
	return id + ":q" + digest(k.cred, k.route, k.major)
}

// lqueue is the line of this process's waiters on one (credential, route,
// major), in two lanes (urgent ahead, see [store.Claim].Priority). Its driver goroutine claims slots for the waiters at its front:
// however many goroutines wait, one Redis call at a time is made for them.
type lqueue struct {
	key     qkey
	id      string // the queue's ticket in Redis
	waiters []*waiter
	streak  int           // urgent grants in a row (see store/internal/lane)
	wakeup  chan struct{} // capacity 1: a kick for the driver

	// What the driver learned from its last claim, guarded by Store.mu.
	hash       string      // the bucket hash the queue waits on, or ""
	scope      store.Scope // what made it wait
	boundUntil time.Time   // the wait is known to last until then at least
	unknown    bool        // waiting for a response: a local Update wakes it
	bid        string      // the bucket id the queue last claimed on
	sleepUntil time.Time   // when the driver's current sleep ends
	ticket     bool        // holds a ticket in bucket bid's line
	idle       bool        // the driver waits for a waiter: a new one kicks it
	stalled    bool        // the driver's call outlasted the call timeout and has not returned

	// A lease: slots a claim took beyond the queue's waiters, for the next
	// ones to take without a round trip (see lease.go).
	lease      []grant
	leaseClaim store.Claim // the claim they were granted for
	leaseUntil time.Time   // when the unused ones go back
	leaseWant  int         // how many extra slots the next claim asks for
	lastGrant  time.Time   // when a claim last granted
}

// Waiter states.
const (
	waiting    = iota
	granted    // permit set
	failed     // err set
	handedOver // the local limiter decides
	abandoned  // the waiter gave up
)

type waiter struct {
	claim    store.Claim
	ready    chan struct{} // closed when state leaves waiting
	start    time.Time
	deadline time.Time // ctx's deadline, or zero
	state    int       // guarded by Store.mu
	permit   grant
	err      error
	local    *store.Reservation // granted by the local limiter first, during a grace period
}

func isUrgent(w *waiter) bool { return w.claim.Priority == store.PriorityUrgent }
func isRetry(w *waiter) bool  { return w.claim.Retry }

// add places w in its lane of q (see store/internal/lane), a retry at its
// front; s.mu must be held.
func (q *lqueue) add(w *waiter) {
	if w.claim.Retry {
		q.waiters = lane.Insert(q.waiters, lane.PlaceRetry(q.waiters, 0, isUrgent(w), isUrgent, isRetry), w)
		return
	}
	q.waiters = lane.Insert(q.waiters, lane.Place(q.waiters, 0, isUrgent(w), isUrgent, q.streak), w)
}

// kick wakes the driver of q if it sleeps.
func (q *lqueue) kick() {
	select {
	case q.wakeup <- struct{}{}:
	default:
	}
}

// boundFrom returns how long a new waiter is known to wait at least.
func (q *lqueue) boundFrom(now time.Time) time.Duration {
	if q.boundUntil.After(now) {
		return q.boundUntil.Sub(now)
	}
	return 0
}

func (q *lqueue) remove(w *waiter) {
	for i, x := range q.waiters {
		if x == w {
			q.waiters = append(q.waiters[:i], q.waiters[i+1:]...)
			return
		}
	}
}

// settle moves w out of the queue with a final state; s.mu must be held.
func (q *lqueue) settle(w *waiter, state int) {
	w.state = state
	close(w.ready)
}

// queue returns the queue of k, creating it and starting its driver; s.mu
// must be held.
func (s *Store) queue(k qkey) *lqueue {
	q := s.queues[k]
	if q != nil {
		return q
	}
	q = &lqueue{key: k, id: queueID(s.id, k), wakeup: make(chan struct{}, 1)}
	s.queues[k] = q
	m := s.byCred[k.cred]
	if m == nil {
		m = make(map[*lqueue]struct{})
		s.byCred[k.cred] = m
	}
	m[q] = struct{}{}
	s.wg.Add(1)
	go s.drive(q)
	return q
}

// drop forgets q; s.mu must be held.
func (s *Store) drop(q *lqueue) {
	delete(s.queues, q.key)
	if m := s.byCred[q.key.cred]; m != nil {
		delete(m, q)
		if len(m) == 0 {
			delete(s.byCred, q.key.cred)
		}
	}
}

// dropTicket leaves the line of bucket bid, the one q waited on, so that a
// queue that emptied without being served keeps no slot from other
// processes.
func (s *Store) dropTicket(q *lqueue, bid string) {
	k := s.keysOf(q.key.cred)
	stalled, err := s.call(q, func(ctx context.Context) error {
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.ZRem(ctx, k.tickets(bid), q.id)
			p.ZRem(ctx, k.ticketExp(bid), q.id)
			return nil
		})
		return err
	})
	if err != nil && !stalled && s.ctx.Err() == nil {
		s.errs.Add(1)
	}
}

// compatible reports whether two claims of one queue may share a claim call.
func compatible(a, b *store.Claim) bool {
	return a.Global == b.Global && a.GlobalLimit == b.GlobalLimit && a.TokenAuth == b.TokenAuth && a.Spacing == b.Spacing
}

// driverLinger is how long a driver whose queue emptied waits for a new
// waiter before it ends, so that a queue in steady use keeps its driver.
const driverLinger = 100 * time.Millisecond

// drive claims slots for q's waiters until the queue stays empty for
// driverLinger or the Store closes.
func (s *Store) drive(q *lqueue) {
	defer s.wg.Done()
	idle := 0 // consecutive waits for a response, for the poll back-off
	var linger *time.Timer
	for {
		s.mu.Lock()
		q.idle = false
		if !s.closed && len(q.waiters) == 0 && !s.degraded.Load() {
			if linger == nil {
				linger = time.NewTimer(driverLinger)
				defer linger.Stop()
			} else {
				linger.Reset(driverLinger)
			}
			if s.lingerFor(q, linger) {
				idle = 0
				continue
			}
		}
		if s.closed || len(q.waiters) == 0 {
			s.drop(q)
			ticket := q.ticket && !s.closed
			lease := q.takeLease()
			s.mu.Unlock()
			s.giveBackAll(lease)
			if ticket {
				s.dropTicket(q, q.bid)
			}
			return
		}
		if s.degraded.Load() {
			for _, w := range q.waiters {
				q.settle(w, handedOver)
			}
			q.waiters = nil
			s.drop(q)
			lease := q.takeLease()
			s.mu.Unlock()
			s.giveBackAll(lease)
			return
		}
		head := q.waiters[0].claim
		n := 1
		for n < len(q.waiters) && n < s.maxBatch && compatible(&head, &q.waiters[n].claim) {
			n++
		}
		extra := s.leaseFor(q, time.Now())
		guess := s.guesses[q.key.cred+"\x00"+q.key.route]
		s.mu.Unlock()

		// The claim must see every update of the credential handed to the
		// outbox so far (a 429's pause, a slot given back, a learned
		// bucket): it carries them, or waits until they are written.
		ups := s.out.take(q.key.cred, s.maxBatch)
		if ups == nil {
			if waited, ok := s.synced(q.key.cred); !ok {
				if s.ctx.Err() != nil {
					continue // closing
				}
				if s.policy == FailClosed {
					s.fail(q, &head, unavailable("update", errOutbox))
				}
				s.sleep(q, s.poll)
				continue
			} else if waited {
				s.mu.Lock()
				guess = s.guesses[q.key.cred+"\x00"+q.key.route]
				s.mu.Unlock()
			}
		}
		prefix := s.nextID() + ":"
		var r claimReply
		var wakes []int64
		stalled, err := s.call(q, func(ctx context.Context) (err error) {
			r, wakes, err = s.claim(ctx, &head, guess, n, extra, prefix, q.id, ups)
			return err
		})
		if ups != nil {
			s.taken(ups, wakes, err == nil)
		}
		if err != nil {
			if s.ctx.Err() != nil {
				continue // closing
			}
			if !stalled {
				s.failed(err)
			}
			if stalled || !answered(err) {
				s.orphans(q, &head, guess, n, prefix)
			}
			if s.policy == FailClosed {
				s.fail(q, &head, &store.WaitError{Err: fmt.Errorf("%w: claim: %w", ErrUnavailable, err)})
				s.sleep(q, s.poll)
			}
			continue
		}
		switch r.kind {
		case replyResolve:
			s.mu.Lock()
			s.setGuess(q.key.cred+"\x00"+q.key.route, r.hash)
			s.mu.Unlock()
		case replyRefuse:
			werr := &store.WaitError{Scope: store.ScopeGuard, RetryAfter: time.Duration(r.retry) * time.Millisecond}
			key := head.Credential
			switch r.reason {
			case 1:
				werr.Err = store.ErrInvalidBudget
			case 2:
				werr.Err = store.ErrUnauthorized
			default:
				werr.Err = store.ErrWebhookGone
				key += "\x00" + head.Major
			}
			s.refused(key, werr)
			s.fail(q, &head, werr)
		case replyGrant:
			idle = 0
			if r.delay > 0 && !s.hold(q, &head, guess, r, prefix) {
				continue
			}
			s.grant(q, &head, guess, r, prefix)
		case replyWait:
			d := time.Duration(r.sleep) * time.Millisecond
			if r.bound == 0 {
				d = min(d<<min(idle, 3), 8*s.poll)
				idle++
			} else {
				idle = 0
			}
			s.waitFor(q, &head, guess, r, d)
			s.sleep(q, d)
		}
	}
}

// lingerFor waits until a waiter joins q, t fires or the Store closes, and
// reports whether a waiter joined. It first leaves the line of the bucket q
// waited on and forgets what q's claims learned, as a driver that ends
// does, so that a new waiter finds q as it would find a new queue. s.mu
// must be held; it is released, and held again on return when the result
// is false.
func (s *Store) lingerFor(q *lqueue, t *time.Timer) bool {
	ticket, bid := q.ticket, q.bid
	q.hash, q.scope, q.boundUntil, q.unknown = "", "", time.Time{}, false
	q.bid, q.sleepUntil, q.ticket = "", time.Time{}, false
	q.idle = true
	s.mu.Unlock()
	if ticket {
		s.dropTicket(q, bid)
	}
	for {
		s.mu.Lock()
		expire := s.leaseExpiry(q)
		s.mu.Unlock()
		select {
		case <-q.wakeup:
			s.mu.Lock()
			if len(q.waiters) > 0 || s.closed || s.degraded.Load() {
				s.mu.Unlock()
				return true
			}
			s.mu.Unlock()
			continue
		case <-expire:
			s.expireLease(q)
			continue
		case <-t.C:
		case <-s.done:
		}
		s.mu.Lock()
		q.idle = false
		return false
	}
}

// claim runs claim.lua for up to n waiters like c.
// The updates ups, all of c's credential and in order, are applied first,
// in the same call; their replies are the wakes.
func (s *Store) claim(ctx context.Context, c *store.Claim, guess string, n, extra int, prefix, qid string, ups []*update) (claimReply, []int64, error) {
	var st step
	for _, it := range ups {
		gid, tid := st.update(s, it.h, it.u, it.seq)
		it.bid = gid
		if it.u.Sent {
			it.bid = tid
		}
	}
	st.claim(s, c, guess, n, extra, prefix, qid)
	v, err := st.run(ctx, s.client, s.clockArg()).Result()
	if err != nil {
		return claimReply{}, nil, err
	}
	r, err := parseStep(v, len(ups), true)
	return r.claim, r.wakes, err
}

// grant hands the slots of r to the waiters at the front of q and gives
// back those nobody is left to take.
func (s *Store) grant(q *lqueue, head *store.Claim, guess string, r claimReply, prefix string) {
	var surplus []grant
	s.mu.Lock()
	p0 := s.permitOf(q, head, guess, r, prefix, 1)
	q.boundUntil, q.unknown, q.hash, q.ticket = time.Time{}, false, p0.Bucket, r.ticket
	q.bid = bucketID(r.bkind, p0.Bucket, q.key.route, q.key.major)
	for i := 1; i <= r.count; i++ {
		p := s.permitOf(q, head, guess, r, prefix, i)
		if len(q.waiters) > 0 && compatible(head, &q.waiters[0].claim) {
			w := q.waiters[0]
			q.waiters = q.waiters[1:]
			q.streak = lane.Granted(q.streak, isUrgent(w))
			w.permit = p
			q.settle(w, granted)
			continue
		}
		surplus = append(surplus, p)
	}
	surplus = s.keepLease(q, head, surplus)
	s.mu.Unlock()
	for _, p := range surplus {
		s.giveBack(p)
	}
}

// permitOf returns the i-th permit granted by the claim reply r.
func (s *Store) permitOf(q *lqueue, head *store.Claim, guess string, r claimReply, prefix string, i int) grant {
	hash := ""
	if r.bkind == kindLearned {
		hash = guess
	}
	return grant{Bucket: hash, Handle: &permit{
		cred: q.key.cred, route: q.key.route, major: q.key.major, sub: q.key.kind,
		kind: r.bkind, hash: hash, member: prefix + strconv.Itoa(i), global: head.Global, tokenAuth: head.TokenAuth,
		limit: r.limit,
	}}
}

// waitFor records a wait reply and fails the waiters whose deadline or
// MaxWait comes before its known end.
func (s *Store) waitFor(q *lqueue, head *store.Claim, guess string, r claimReply, sleep time.Duration) {
	now := time.Now()
	bound := time.Duration(r.bound) * time.Millisecond
	s.mu.Lock()
	defer s.mu.Unlock()
	q.sleepUntil = now.Add(sleep)
	if r.ticket {
		q.ticket = true
	}
	q.bid = guessedID(guess, head.Route, head.Major)
	q.scope = [...]store.Scope{store.ScopeUser, store.ScopeUser, store.ScopeGlobal, store.ScopeShared, store.ScopeBlocked}[r.scope]
	if guess != noBucket {
		q.hash = guess
	}
	q.unknown = r.bound == 0
	q.boundUntil = time.Time{}
	until := now.Add(time.Millisecond) // a wait of unknown length fails only the waiters that will not wait
	if bound > 0 {
		q.boundUntil = now.Add(bound)
		until = q.boundUntil
	}
	for _, w := range q.due(nil, until) {
		w.err = &store.WaitError{Bucket: q.hash, Scope: q.scope, RetryAfter: bound, Err: w.err}
		q.settle(w, failed)
	}
}

// due removes from q the waiters (compatible with head, unless head is
// nil) whose deadline or MaxWait comes before until and returns them, each
// with the reason in err; s.mu must be held.
func (q *lqueue) due(head *store.Claim, until time.Time) []*waiter {
	var out []*waiter
	kept := q.waiters[:0]
	for _, w := range q.waiters {
		var err error
		if head == nil || compatible(head, &w.claim) {
			err = store.Exceeds(!w.deadline.IsZero() && until.After(w.deadline),
				w.claim.MaxWait > 0 && until.After(w.start.Add(w.claim.MaxWait)) || w.claim.NoWait && until.After(w.start))
		}
		if err == nil {
			kept = append(kept, w)
			continue
		}
		w.err = err
		out = append(out, w)
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
	return out
}

// hold waits until the global slot the claim r reserved for the waiter at
// the front of q opens, and reports whether a waiter is left to take it.
// Waiters like head whose deadline or MaxWait comes first fail at once;
// when none is left, the slot is given back before they learn it, so that
// what they do next finds it free.
func (s *Store) hold(q *lqueue, head *store.Claim, guess string, r claimReply, prefix string) bool {
	d := time.Duration(r.delay) * time.Millisecond
	until := time.Now().Add(d)
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := time.Now()
		doomed := q.due(head, until)
		left := len(q.waiters) > 0 && compatible(head, &q.waiters[0].claim)
		if left {
			q.scope, q.unknown = store.ScopeGlobal, false
			q.boundUntil, q.sleepUntil = until, until
		}
		s.mu.Unlock()
		if !left {
			s.giveBack(s.permitOf(q, head, guess, r, prefix, 1))
		}
		if len(doomed) > 0 {
			s.mu.Lock()
			for _, w := range doomed {
				if w.state == waiting {
					w.err = &store.WaitError{Bucket: q.hash, Scope: store.ScopeGlobal, RetryAfter: until.Sub(now), Err: w.err}
					q.settle(w, failed)
				}
			}
			s.mu.Unlock()
		}
		if !left {
			return false
		}
		select {
		case <-t.C:
			// A kick that came meanwhile is stale: the driver claims
			// again at once if waiters are left.
			select {
			case <-q.wakeup:
			default:
			}
			return true
		case <-s.done:
			return true
		case <-q.wakeup:
			// A waiter left, or one came that cannot wait this long.
		}
	}
}

// fail settles the waiters of q that made the same claim as head with err.
func (s *Store) fail(q *lqueue, head *store.Claim, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	kept := q.waiters[:0]
	for _, w := range q.waiters {
		if !compatible(head, &w.claim) {
			kept = append(kept, w)
			continue
		}
		w.err = err
		q.settle(w, failed)
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
}

// sleep waits d, or until q is kicked or the Store closes.
func (s *Store) sleep(q *lqueue, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-q.wakeup:
	case <-s.done:
	}
}

// failed counts a Redis error and applies the failure policy to the Store
// as a whole. Under [FailOpen] it switches to the local limiter and hands
// it every waiter at once: their drivers may still be inside a Redis call
// that stalls.
func (s *Store) failed(err error) {
	s.errs.Add(1)
	if s.policy != FailOpen || errors.Is(err, context.Canceled) && s.ctx.Err() != nil {
		return
	}
	s.mu.Lock()
	if s.degraded.Load() {
		s.mu.Unlock()
		return
	}
	s.fellAt = time.Now()
	s.graceUntil = time.Time{}
	s.degraded.Store(true)
	for _, q := range s.queues {
		for _, w := range q.waiters {
			q.settle(w, handedOver)
		}
		clear(q.waiters)
		q.waiters = q.waiters[:0]
		q.kick()
	}
	if !s.probing && !s.closed {
		s.probing = true
		s.wg.Add(1)
		go s.probe()
	}
	s.mu.Unlock()
	s.fallbacks.Add(1)
	s.log.LogAttrs(context.Background(), slogWarn, "ratecord: redis unavailable, limiting locally",
		attrErr(err), attrShare(s.share))
	if s.onFallback != nil {
		s.onFallback(err)
	}
}
