package redisstore

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/lane"
)

// session is what a Store knows and does for one credential: the queues of
// its waiters, the reports of its responses that Redis has not applied
// yet, what the last replies said about when to ask again, and the driver:
// the one goroutine that calls Redis for the credential, one script call at
// a time, each carrying the reports gathered so far and the claims of every
// queue whose turn may have come.
//
// Every field is guarded by Store.mu.
type session struct {
	cred   string
	tag    string // digest(cred): the keys' hash tag, which names the credential in pushes
	keys   credKeys
	queues map[qkey]*lqueue

	reports []*update   // not applied in Redis yet, oldest first
	lost    []*lostCall // calls whose replies were lost, undone by the next call if they ran
	flushAt time.Time   // the reports go by then, with a claim or alone (zero: none waits)

	// The global window: no claim that counts against it before gate,
	// which the last refusal named; the wait lasts until gateBound at least.
	gate, gateBound time.Time
	gatePushed      time.Time            // when a push for the global window last came
	gateAsked       time.Time            // when the call whose reply set the gate was sent
	pushes          map[string]time.Time // line -> when a push for it last came, the last few seconds
	// leaves are the lines whose turn came (a push) while no waiter of
	// this process was left for it: the next call gives the places up.
	leaves map[string]bool
	glimit int // the global limit the claims name

	// applied is the number of the last report Redis applied (or that was
	// dropped); progress is closed and replaced when it grows or a call
	// fails, for those who wait for reports to be applied (Estimate).
	applied  uint64
	failures uint64
	progress chan struct{}
	// refused counts the calls in a row that Redis answered with an
	// error; the driver waits before the next (see refusedBackoff), and
	// after maxRefused the failure policy applies.
	refused     int
	refusedTill time.Time

	// recalls holds, per line (globalRecall: the global window), when a
	// response last spent it with grants out (see recall.go); bounded.
	recalls map[string]time.Time

	wakeup  chan struct{} // capacity 1: a kick for the driver
	running bool
	idle    time.Time // since when the session has had nothing to do (zero: busy)
}

// update is the report of one permit granted through Redis, waiting to be
// applied.
type update struct {
	seq uint64
	h   *permit
	u   store.Update
	at  time.Time // when the response arrived (or the slot was given back)
}

// lostCall is a call whose reply was lost: it may have run, or may not.
type lostCall struct {
	no     uint64
	claims []lostClaim
}

// lostClaim names what one claim of a lost call may have taken.
type lostClaim struct {
	bid, pid, prefix, major string
	global                  bool
}

// Driver tuning.
const (
	// maxClaims bounds the claims of one call: the queues served in one
	// round trip.
	maxClaims = 32
	// maxReports bounds the reports of one call.
	maxReports = 256
	// maxLost bounds the lost calls a session remembers to undo.
	maxLost = 4
	// flushDelay is how long a report that nobody waits for waits for a
	// claim to carry it before it is sent alone.
	flushDelay = 20 * time.Millisecond
	// urgentDelay gathers the reports that others wait for before they go.
	urgentDelay = time.Millisecond
	// sessionLinger is how long a session with nothing to do lives on,
	// while the Store holds at most crowd sessions; beyond, crowdLinger:
	// a burst of many credentials (a proxy relaying many users' tokens)
	// keeps about its rate times crowdLinger sessions, not its rate times
	// a second. The short linger still covers the gap between a grant and
	// its request's write, when a recall may come (see recall.go), unless
	// the process stalls longer than that between them.
	sessionLinger = time.Second
	crowd         = 1024
	crowdLinger   = 50 * time.Millisecond
	// refusedBackoff is the wait after a call Redis answered with an
	// error, doubling with each such call in a row up to
	// maxRefusedBackoff; after maxRefused of them the failure policy
	// applies.
	refusedBackoff    = 10 * time.Millisecond
	maxRefusedBackoff = time.Second
	maxRefused        = 3
)

// session returns the session of cred, creating it and starting its
// driver; s.mu must be held and the Store open.
func (s *Store) session(cred string) *session {
	ss := s.sessions[cred]
	if ss == nil {
		s.sweep(time.Now())
		tag := digest(cred)
		ss = &session{cred: cred, tag: tag, keys: s.keysOfTag(tag), queues: make(map[qkey]*lqueue),
			wakeup: make(chan struct{}, 1), glimit: s.pol.GlobalLimit, progress: make(chan struct{})}
		s.sessions[cred] = ss
		s.byTag[tag] = ss
	}
	if !ss.running {
		ss.running = true
		s.wg.Add(1)
		go s.drive(ss)
	}
	return ss
}

// sweep forgets, at most once a second, the sessions whose driver ended
// and whose waits have ended, as their drivers would have had they lived
// on; s.mu must be held.
func (s *Store) sweep(now time.Time) {
	if now.Sub(s.swept) < time.Second {
		return
	}
	s.swept = now
	for _, ss := range s.sessions {
		if !ss.running {
			s.endSession(ss)
		}
	}
}

// kick wakes the driver of ss if it sleeps.
func (ss *session) kick() {
	select {
	case ss.wakeup <- struct{}{}:
	default:
	}
}

// queue returns the queue of k in ss, creating it.
func (ss *session) queue(k qkey) *lqueue {
	q := ss.queues[k]
	if q == nil {
		q = &lqueue{key: k}
		ss.queues[k] = q
	}
	return q
}

// ready reports whether q's claim may go at now.
func (ss *session) ready(q *lqueue, now time.Time) bool {
	if len(q.waiters) == 0 {
		return false
	}
	if !q.turn.IsZero() && !now.Before(q.turn) {
		return true
	}
	if now.Before(q.notBefore) {
		return false
	}
	// The global window's gate holds the queues it refused last; a queue
	// its bucket refused last claims when the bucket may grant (its next
	// claim learns if the window holds it).
	return !q.waiters[0].claim.Global || !q.global || !now.Before(ss.gate)
}

// planned is one claim of a call.
type planned struct {
	q      *lqueue
	head   store.Claim
	key    string // the route's key in Store.routes: credential NUL route
	guess  string
	n      int // waiters it is for
	extra  int // slots asked for a lease
	prefix string
	until  time.Time // none of the queue's waiters waits past then (zero: one waits without a bound)
	sole   int       // soleGlobal, soleBucket: the places in lines only this queue needs
}

// lineUse counts the queues of a session with waiters that need a place
// in a line: those whose first waiter makes global claims, and those
// waiting in each bucket's line.
type lineUse struct {
	global int
	bucket map[string]int
}

// linesInUse returns what the queues of ss with waiters need; s.mu must
// be held.
func (ss *session) linesInUse() lineUse {
	u := lineUse{bucket: make(map[string]int)}
	for _, q := range ss.queues {
		if len(q.waiters) == 0 {
			continue
		}
		if q.waiters[0].claim.Global {
			u.global++
		}
		if q.line != "" {
			u.bucket[q.line]++
		}
	}
	return u
}

// sole returns which of the process's places in lines only q, a queue
// with waiters, needs (soleGlobal, soleBucket): the global window's, when
// no other queue with waiters makes global claims; the line of the bucket
// bid, when no other queue with waiters waits in it.
func (u lineUse) sole(q *lqueue, bid string) int {
	global, bucket := u.global, u.bucket[bid]
	if q.waiters[0].claim.Global {
		global--
	}
	if q.line == bid {
		bucket--
	}
	sole := 0
	if global == 0 {
		sole |= soleGlobal
	}
	if bucket == 0 {
		sole |= soleBucket
	}
	return sole
}

// plan is what one call of the driver carries.
type plan struct {
	leaves  []string
	no      uint64
	sentAt  time.Time // when the call left: a push that came since is news to its reply
	lost    []*lostCall
	reports []*update
	claims  []planned
	glimit  int
}

func (p *plan) empty() bool {
	return len(p.claims) == 0 && len(p.reports) == 0 && len(p.lost) == 0 && len(p.leaves) == 0
}

// plan chooses what the next call of ss carries at now: the claims of
// every queue whose turn may have come, the urgent lane first, then in
// the order their first waiters came; the reports, when a claim goes or
// they are due; the lost calls to undo. s.mu must be held.
func (s *Store) plan(ss *session, now time.Time) plan {
	p := plan{lost: ss.lost}
	var ready []*lqueue
	for _, q := range ss.queues {
		if q.held != "" && len(q.waiters) == 0 && !q.asking(now) {
			// Its callers stopped asking before they used the turn it kept.
			if ss.leaves == nil {
				ss.leaves = make(map[string]bool)
			}
			ss.leaves[q.held] = true
			q.held, q.turn = "", time.Time{}
		}
		s.serveLease(q, now)
		if ss.ready(q, now) {
			ready = append(ready, q)
		}
	}
	slices.SortFunc(ready, func(a, b *lqueue) int {
		ua, ub := isUrgent(a.waiters[0]), isUrgent(b.waiters[0])
		if ua != ub {
			if ua {
				return -1
			}
			return 1
		}
		return a.waiters[0].start.Compare(b.waiters[0].start)
	})
	if len(ready) > maxClaims {
		ready = ready[:maxClaims]
	}
	glimit := 0
	var use lineUse
	if len(ready) > 0 {
		use = ss.linesInUse()
	}
	for _, q := range ready {
		head := q.waiters[0].claim
		if head.Global {
			// One call names one global limit: a claim naming another
			// waits for the next call.
			if l := s.pol.Limit(&head); glimit == 0 {
				glimit = l
			} else if l != glimit {
				continue
			}
		}
		q.turn, q.held = time.Time{}, ""
		key := ss.cred + "\x00" + q.key.route
		guess := s.guess(key)
		p.claims = append(p.claims, planned{q: q, head: head, key: key, guess: guess,
			n: q.batch(s.maxBatch), extra: s.leaseFor(q, now), until: q.until(now),
			sole: use.sole(q, guessedID(guess, q.key.route, q.key.major))})
	}
	if glimit == 0 {
		glimit = ss.glimit
	}
	ss.glimit = glimit
	p.glimit = glimit
	for name := range ss.leaves {
		// A queue of the line that claims in this call keeps its place.
		kept := false
		for _, c := range p.claims {
			kept = kept || c.q.line == name || name == globalLine && c.head.Global
		}
		if !kept {
			p.leaves = append(p.leaves, name)
		}
		delete(ss.leaves, name)
	}
	if len(ss.reports) > 0 && (len(p.claims) > 0 || len(p.leaves) > 0 || !now.Before(ss.flushAt)) {
		p.reports = append([]*update(nil), ss.reports[:min(len(ss.reports), maxReports)]...)
	}
	if p.empty() {
		return p
	}
	p.no = s.calls.Add(1)
	for i := range p.claims {
		p.claims[i].prefix = permitPrefix(s.id, p.no, i+1)
	}
	return p
}

// nextWake returns when the driver of ss has something to do next by the
// passing of time alone (zero: nothing), and whether ss is idle: no waiter,
// report, lease or lost call. s.mu must be held.
func (ss *session) nextWake(now time.Time) (time.Time, bool) {
	var at time.Time
	earlier := func(t time.Time) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at = t
		}
	}
	idle := len(ss.reports) == 0 && len(ss.lost) == 0 && len(ss.leaves) == 0
	for _, q := range ss.queues {
		if len(q.lease) > 0 {
			earlier(q.leaseUntil)
			idle = false
		}
		if len(q.waiters) == 0 {
			if q.held != "" {
				// The turn it keeps goes to the next process if no waiter
				// comes while its callers count as asking.
				earlier(q.missed.Add(keepAsking))
				idle = false
			}
			continue
		}
		idle = false
		t := q.notBefore
		if q.waiters[0].claim.Global && q.global && ss.gate.After(t) {
			t = ss.gate
		}
		if !q.turn.IsZero() && q.turn.Before(t) {
			t = q.turn
		}
		if t.Before(now) {
			t = now
		}
		earlier(t)
	}
	if len(ss.reports) > 0 || len(ss.leaves) > 0 {
		earlier(ss.flushAt)
	}
	return at, idle
}

// drive is the driver of ss: it calls Redis for the credential until the
// session has had nothing to do for sessionLinger, or the Store closes or
// falls back to its local limiter.
func (s *Store) drive(ss *session) {
	defer s.wg.Done()
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		s.mu.Lock()
		now := time.Now()
		if s.closed {
			s.endSession(ss)
			s.mu.Unlock()
			return
		}
		s.expireLeases(ss, now)
		if s.degraded.Load() {
			s.handOver(ss)
			if ss.quiet() {
				s.endSession(ss)
				s.mu.Unlock()
				return
			}
			// The reports and the undoing of lost calls wait for Redis.
			s.mu.Unlock()
			s.sleepUntil(ss, t, now.Add(s.probeEvery))
			continue
		}
		if now.Before(ss.refusedTill) {
			// Redis refused the last call: wait before the next.
			at := ss.refusedTill
			s.mu.Unlock()
			s.sleepUntil(ss, t, at)
			continue
		}
		p := s.plan(ss, now)
		if p.empty() {
			at, idle := ss.nextWake(now)
			if idle {
				linger := s.linger()
				if ss.idle.IsZero() {
					ss.idle = now
				} else if now.Sub(ss.idle) >= linger {
					s.endSession(ss)
					s.mu.Unlock()
					return
				}
				at = ss.idle.Add(linger)
			} else {
				ss.idle = time.Time{}
			}
			s.mu.Unlock()
			s.sleepUntil(ss, t, at)
			continue
		}
		ss.idle = time.Time{}
		s.mu.Unlock()
		s.awaitSubscription()
		s.send(ss, &p)
	}
}

// linger returns how long a session with nothing to do lives on; s.mu
// must be held.
func (s *Store) linger() time.Duration {
	if len(s.sessions) > crowd {
		return crowdLinger
	}
	return sessionLinger
}

// sleepUntil waits until at (zero: a kick), a kick of ss, or the Store
// closes.
func (s *Store) sleepUntil(ss *session, t *time.Timer, at time.Time) {
	var c <-chan time.Time
	if !at.IsZero() {
		t.Reset(max(time.Until(at), 0))
		c = t.C
	}
	select {
	case <-c:
	case <-ss.wakeup:
	case <-s.done:
	}
	if c != nil && !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
}

// quiet reports whether ss holds nothing Redis must still learn: no
// report, lease or lost call. s.mu must be held.
func (ss *session) quiet() bool {
	if len(ss.reports) > 0 || len(ss.lost) > 0 {
		return false
	}
	for _, q := range ss.queues {
		if len(q.lease) > 0 {
			return false
		}
	}
	return true
}

// endSession stops the driver of ss and forgets what is idle: its queues
// without waiters or lease whose waits have ended, and the session itself
// once nothing is left. A wait this process knows of outlives the driver:
// a waiter that comes before it ends is refused or kept without a Redis
// command. s.mu must be held.
func (s *Store) endSession(ss *session) {
	ss.running = false
	now := time.Now()
	for k, q := range ss.queues {
		if len(q.waiters) == 0 && len(q.lease) == 0 && !q.notBefore.After(now) && !q.bound.After(now) || s.closed {
			delete(ss.queues, k)
		}
	}
	if len(ss.queues) == 0 && ss.quiet() && !ss.gate.After(now) && !ss.gateBound.After(now) || s.closed {
		delete(s.sessions, ss.cred)
		delete(s.byTag, ss.tag)
	}
}

// handOver hands every waiter of ss to the local limiter; s.mu must be
// held.
func (s *Store) handOver(ss *session) {
	for _, q := range ss.queues {
		for _, w := range q.waiters {
			q.settle(w, handedOver)
		}
		clear(q.waiters)
		q.waiters = q.waiters[:0]
	}
}

// send makes the call p of ss and applies its reply.
func (s *Store) send(ss *session, p *plan) {
	var st step
	for _, c := range p.lost {
		st.undoCall(s, ss.keys, c)
	}
	sentAt := time.Now()
	p.sentAt = sentAt
	for _, it := range p.reports {
		st.report(s, ss.keys, it.h, &it.u, it.seq, millisDown(sentAt.Sub(it.at)))
	}
	for _, c := range p.claims {
		st.claim(s, ss.keys, &c.head, c.guess, c.n, c.extra, c.prefix, lifeOf(c.until, sentAt), c.sole)
	}
	for _, name := range p.leaves {
		st.leave(ss.keys, name)
	}
	st.build(s, ss.keys, ss.tag, p.no, p.glimit)
	var v any
	stalled, err := s.call(ss, func(ctx context.Context) (err error) {
		v, err = st.run(ctx, s).Result()
		return err
	})
	var r stepReply
	if err == nil {
		r, err = parseStep(v, len(p.reports), len(p.claims))
	}
	now := time.Now()
	if err != nil {
		s.callFailed(ss, p, err, stalled)
		return
	}
	s.applied(ss, p, r, now)
}

// callFailed applies the failure policy to a call that failed: its
// reports stay queued, and a call that may have run is undone by the next.
func (s *Store) callFailed(ss *session, p *plan, err error, stalled bool) {
	if s.ctx.Err() != nil {
		return // closing
	}
	s.mu.Lock()
	if stalled || !answered(err) {
		// It may have run, now or later: the next call undoes it if it
		// did (and a late copy of it does nothing once the next ran).
		lc := &lostCall{no: p.no}
		for _, c := range p.claims {
			lc.claims = append(lc.claims, lostClaim{bid: guessedID(c.guess, c.head.Route, c.head.Major),
				pid: probeID(c.head.Route, c.head.Major), prefix: c.prefix, major: c.head.Major, global: c.head.Global})
		}
		ss.lost = append(ss.lost, lc)
		if len(ss.lost) > maxLost {
			ss.lost = ss.lost[len(ss.lost)-maxLost:]
		}
	}
	ss.failures++
	ss.signal()
	s.mu.Unlock()
	if errors.Is(err, errDescheduled) {
		// This process did not run for part of the call: Redis is not
		// shown to fail. The claims and reports go again with the next
		// call, which undoes this one if it ran.
		return
	}
	if !stalled {
		if errors.Is(err, errReply) || errors.Is(err, errStale) || permanent(err) {
			s.errs.Add(1)
			s.dropReports(ss, p, err)
			// Sending the claims again at once would meet the same
			// error: wait a little longer each time, and once Redis has
			// refused maxRefused calls in a row, apply the failure
			// policy as for an outage (the probe tries Redis again).
			s.mu.Lock()
			ss.refused++
			ss.refusedTill = time.Now().Add(min(refusedBackoff<<min(ss.refused-1, 10), maxRefusedBackoff))
			n := ss.refused
			s.mu.Unlock()
			if n >= maxRefused {
				s.failed(err)
			}
		} else {
			s.failed(err)
		}
	}
	if s.policy == FailClosed {
		s.mu.Lock()
		for _, c := range p.claims {
			c.q.fail(&c.head, unavailable("claim", err))
		}
		s.mu.Unlock()
		// Do not spin on a server that refuses: wait before the next call.
		t := time.NewTimer(s.pushWait)
		select {
		case <-t.C:
		case <-s.done:
		}
		t.Stop()
	}
}

// dropReports drops the reports of a call that Redis answered with an
// error that sending it again would not change, rather than send them
// forever, and logs it.
func (s *Store) dropReports(ss *session, p *plan, err error) {
	s.mu.Lock()
	n := s.removeReports(ss, p.reports)
	s.mu.Unlock()
	s.out.dropped.Add(uint64(n))
	s.log.LogAttrs(context.Background(), slogError, "ratecord: redis rejected a call, its reports dropped", attrErr(err))
}

// removeReports removes the reports rs, the oldest of ss, from its queue
// and returns how many; s.mu must be held.
func (s *Store) removeReports(ss *session, rs []*update) int {
	n := 0
	for n < len(rs) && n < len(ss.reports) && ss.reports[n] == rs[n] {
		n++
	}
	if n > 0 {
		ss.applied = max(ss.applied, ss.reports[n-1].seq)
		ss.signal()
	}
	clear(ss.reports[:n])
	ss.reports = ss.reports[n:]
	if len(ss.reports) == 0 {
		ss.reports = nil
		ss.flushAt = time.Time{}
	}
	s.out.queued.Add(-int64(n))
	return n
}

// signal wakes those who wait for the progress of ss; s.mu must be held.
func (ss *session) signal() {
	close(ss.progress)
	ss.progress = make(chan struct{})
}

// applied applies the reply r of the call p of ss, received at now.
func (s *Store) applied(ss *session, p *plan, r stepReply, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss.lost = nil
	ss.refused, ss.refusedTill = 0, time.Time{}
	s.removeReports(ss, p.reports)
	for i, it := range p.reports {
		s.learnLocked(it.h, it.u)
		s.wakeLocal(ss, it, r.wakes[i], now)
	}
	for i := range p.claims {
		s.answer(ss, &p.claims[i], r.claims[i], now, p.sentAt)
	}
}

// wakeLocal moves the queues of ss that wait on the bucket a report
// concerned to the moment it may grant again (wake ms from now, -1 when
// only a response can), and has those that waited for the route's probe
// ask again; s.mu must be held.
func (s *Store) wakeLocal(ss *session, it *update, wake int64, now time.Time) {
	gid := bucketID(it.h.kind, it.h.hash, it.h.route, it.h.major)
	tid := gid
	if it.u.Bucket != "" {
		tid = learnedID(it.u.Bucket, it.h.major)
	}
	for _, q := range ss.queues {
		if len(q.waiters) == 0 {
			continue
		}
		switch {
		case it.h.kind == kindProbe && q.line == gid:
			// The probe answered: whoever waited for it asks again.
			q.notBefore = time.Time{}
		case wake >= 0 && (q.line == tid || q.line == gid):
			if at := now.Add(time.Duration(wake) * time.Millisecond); q.notBefore.After(at) {
				q.notBefore = at
			}
		}
	}
}

// answer applies the reply r to the claim c of ss, received at now; s.mu
// must be held.
func (s *Store) answer(ss *session, c *planned, r claimReply, now, sent time.Time) {
	q := c.q
	q.asked = sent
	q.urgent = c.head.Priority == store.PriorityUrgent
	q.push = r.kind == replyWait && r.push && r.scope != waitGlobal
	switch r.kind {
	case replyResolve:
		s.setGuess(c.key, r.hash)
		q.notBefore = time.Time{}
	case replyRefuse:
		werr := &store.WaitError{Scope: store.ScopeGuard, RetryAfter: time.Duration(r.retry) * time.Millisecond}
		key := ss.cred
		switch r.reason {
		case 2:
			werr.Err = store.ErrUnauthorized
		default:
			werr.Err = store.ErrWebhookGone
			key += "\x00" + c.head.Major
		}
		s.refusedLocked(key, werr)
		q.fail(&c.head, werr)
	case replyGrant:
		s.noteLimit(c.key, r.limit)
		s.grant(ss, c, r, now, sent)
	case replyWait:
		s.noteLimit(c.key, r.limit)
		s.waitFor(ss, c, r, now, sent)
	}
}

// grant hands the slots of r to the waiters at the front of c's queue, the
// reserved ones to waiters that can wait for them, and keeps the rest as a
// lease or gives them back; s.mu must be held. The call left at sent:
// Redis granted no earlier, and the global window counts each slot from
// then (or its reserved moment) on.
func (s *Store) grant(ss *session, c *planned, r claimReply, now, sent time.Time) {
	q := c.q
	hash := ""
	if r.bkind == kindLearned {
		hash = c.guess
	}
	// The queue's line is its bucket's: the rest of a claim served in part
	// waits there, told by a push when its turn comes.
	q.notBefore, q.bound, q.line, q.global = time.Time{}, time.Time{}, bucketID(r.bkind, hash, q.key.route, q.key.major), false
	q.hash = hash
	var surplus []grant
	reserved := r.count - len(r.delays)
	for i := 1; i <= r.count; i++ {
		p := grant{Bucket: hash, Handle: &permit{
			cred: ss.cred, route: q.key.route, major: q.key.major, sub: q.key.kind,
			kind: r.bkind, hash: hash, member: c.prefix + itoa(i), global: c.head.Global, tokenAuth: c.head.TokenAuth,
			limit: r.limit, line: q.line, granted: sent,
		}}
		var at time.Time
		if i > reserved {
			d := time.Duration(r.delays[i-reserved-1]) * time.Millisecond
			at = now.Add(d)
			p.Handle.(*permit).sendBy = sent.Add(d + s.pol.GlobalHold/2)
		} else {
			p.Handle.(*permit).sendBy = sent.Add(s.pol.GlobalHold / 2)
		}
		handed := false
		for len(q.waiters) > 0 && compatible(&c.head, &q.waiters[0].claim) && (i <= c.n || q.waiters[0].claim.Priority == c.head.Priority) {
			w := q.waiters[0]
			q.waiters = q.waiters[1:]
			if !at.IsZero() {
				if err := store.Exceeds(!w.deadline.IsZero() && at.After(w.deadline),
					w.claim.MaxWait > 0 && at.After(w.start.Add(w.claim.MaxWait)) || w.claim.NoWait); err != nil {
					// It will not wait for this slot: the global window is
					// full until then.
					w.err = &store.WaitError{Bucket: hash, Scope: store.ScopeGlobal, RetryAfter: at.Sub(now), Err: err}
					q.settle(w, failed)
					q.missed = now
					continue
				}
			}
			q.streak = lane.Granted(q.streak, isUrgent(w))
			w.permit, w.at = p, at
			q.settle(w, granted)
			handed = true
			break
		}
		if handed {
			continue
		}
		if !at.IsZero() {
			s.giveBackLocked(ss, p)
			continue
		}
		// No waiter is left for it (the one it was for gave up during
		// the round trip): the queue keeps it as a lease, for the next
		// waiter to take at once.
		surplus = append(surplus, p)
	}
	q.lastUse = now
	for _, p := range s.keepLease(q, &c.head, surplus, c.extra, now) {
		s.giveBackLocked(ss, p)
	}
	if r.at > 0 && len(q.waiters) > 0 {
		// Served in part: the rest's turn comes then, in the global
		// window's line when the window was full (some slots were
		// reserved), in the bucket's otherwise.
		next := now.Add(time.Duration(r.at) * time.Millisecond)
		scope := store.ScopeUser
		if c.head.Global && len(r.delays) > 0 {
			q.global, scope = true, store.ScopeGlobal
			if ss.gate.Before(next) {
				ss.gate, ss.gateAsked = next, sent
			}
		} else {
			q.notBefore, q.bound, q.scope = next, next, scope
		}
		// The script tells that moment as the earliest the rest can be
		// served (as a wait reply's bound): the waiters that will not
		// wait so long fail now, not at their deadlines.
		q.failDue(&c.head, now, next, hash, scope, next.Sub(now))
	}
}

// waitFor records the wait reply r to the claim c, received at now, and
// fails the waiters whose deadline or MaxWait comes before its known end;
// s.mu must be held.
// A push that came after the call left concerns the state the reply
// describes or a later one (the script that pushed saw this process's
// ticket), and may have come before the reply: the queue asks again at
// once. sent is when the call left.
func (s *Store) waitFor(ss *session, c *planned, r claimReply, now, sent time.Time) {
	q := c.q
	at := now.Add(time.Duration(r.at) * time.Millisecond)
	var bound time.Time
	if r.bound > 0 {
		bound = now.Add(time.Duration(r.bound) * time.Millisecond)
	}
	q.scope = scopeOf(r.scope)
	q.line = r.line
	if c.guess != noBucket {
		q.hash = c.guess
	}
	if r.scope == waitGlobal {
		// The global window holds every claim of the credential that
		// counts against it, not this queue's others.
		q.global = true
		ss.gate, ss.gateBound, ss.gateAsked = at, bound, sent
		if ss.gatePushed.After(sent) {
			ss.gate = time.Time{}
		}
	} else {
		q.global = false
		q.notBefore, q.bound = at, bound
		if ss.pushes[q.line].After(sent) && q.line != "" {
			q.notBefore = time.Time{}
		}
	}
	until := now.Add(time.Millisecond) // a wait of unknown length fails only the waiters that will not wait
	if !bound.IsZero() {
		until = bound
	}
	retry := max(until.Sub(now), 0)
	if bound.IsZero() {
		retry = 0
	}
	q.failDue(&c.head, now, until, q.hash, q.scope, retry)
}

// pushed applies a push: the turn of this process in the line name of
// the credential tag comes in at (0: now). A push for the global window
// moves the gate. hash, when set, is the bucket the route of the probe
// that the line's queues waited for maps to: they claim on it at once,
// rather than be told so by a reply of their own.
func (s *Store) pushed(tag, name string, at time.Duration, hash string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.byTag[tag]
	if ss == nil {
		return
	}
	now := time.Now()
	turn, bound := time.Time{}, time.Time{}
	if at > 0 {
		turn, bound = now.Add(at), now.Add(at)
	}
	if name == globalLine {
		ss.gate, ss.gateBound = turn, bound
		ss.gatePushed = now
	}
	if ss.pushes == nil {
		ss.pushes = make(map[string]time.Time)
	}
	if len(ss.pushes) >= 64 {
		for k, t := range ss.pushes {
			if now.Sub(t) > time.Second {
				delete(ss.pushes, k)
			}
		}
	}
	if at == 0 {
		ss.pushes[name] = now
	}
	waiting := false
	for _, q := range ss.queues {
		if q.line == name || name == globalLine && q.global {
			if hash != "" && name != globalLine {
				s.setGuess(ss.cred+"\x00"+q.key.route, hash)
			}
			q.notBefore, q.bound = turn, bound
			// The turn in this line is what the push says, whatever the
			// other line (the global window's, or the bucket's) the queue
			// waited on told it.
			q.turn = now.Add(at)
			if at > 0 {
				// The turn comes no sooner: the waiters that will not wait
				// so long fail now, not at their deadlines.
				scope := store.ScopeUser
				if name == globalLine {
					scope = store.ScopeGlobal
				}
				q.failDue(nil, now, bound, q.hash, scope, at)
			}
			// A queue whose callers keep asking keeps the turn for the
			// waiter it will have by then, or soon after (see
			// lqueue.until), rather than tell the next process, whose
			// callers may have stopped asking as well: told in a chain, the
			// processes of a line would each make a call. It gives the
			// turn up when its callers stop asking (see plan).
			asking := q.asking(now)
			if len(q.waiters) == 0 && asking {
				q.held = name
			}
			waiting = waiting || len(q.waiters) > 0 || asking
		}
	}
	if !waiting {
		// No waiter of this process is left for the turn: give the place
		// up, so that the next process need not wait for it to lapse.
		if ss.leaves == nil {
			ss.leaves = make(map[string]bool)
		}
		ss.leaves[name] = true
		if ss.flushAt.IsZero() || now.Before(ss.flushAt) {
			ss.flushAt = now
		}
		if !ss.running {
			ss.running = true
			s.wg.Add(1)
			go s.drive(ss)
		}
	}
	ss.kick()
}

// resync has every queue of every session ask again: pushes may have been
// lost (Redis was away).
func (s *Store) resync() { s.resyncBefore(time.Time{}) }

// resyncBefore has every queue of every session whose last call was sent
// before since (zero: every queue) ask again: the pushes that concern them
// may have been lost (the subscription was down, or not yet there).
func (s *Store) resyncBefore(since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.resyncs.Add(1)
	for _, ss := range s.sessions {
		if since.IsZero() || ss.gateAsked.Before(since) {
			ss.gate, ss.gateBound = time.Time{}, time.Time{}
		}
		for _, q := range ss.queues {
			if since.IsZero() || q.asked.Before(since) {
				q.notBefore, q.bound = time.Time{}, time.Time{}
			}
		}
		ss.kick()
	}
}

// millisDown converts d to whole milliseconds, rounding down.
func millisDown(d time.Duration) int64 { return int64(d / time.Millisecond) }

// lifeOf returns how long, in whole milliseconds from now, a ticket for
// waiters that wait until until is worth holding: at least 1, or 0 for no
// bound (until zero).
func lifeOf(until, now time.Time) int64 {
	if until.IsZero() {
		return 0
	}
	return max(int64((until.Sub(now)+time.Millisecond-1)/time.Millisecond), 1)
}

func itoa(i int) string { return strconv.Itoa(i) }
