package redisstore

import (
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/lane"
)

// qkey names a process-local queue of a credential. Claims of a kind (see
// [store.Claim].Kind) queue apart, so that a hidden sublimit that holds
// them does not hold the other requests of their bucket.
type qkey struct {
	route, major, kind string
}

// lqueue is the line of this process's waiters on one (credential, route,
// major, kind), in two lanes (urgent ahead, see [store.Claim].Priority).
// The session's driver claims slots for the waiters at its front; however
// many goroutines wait, one claim at a time is made for them. Every field
// is guarded by Store.mu.
type lqueue struct {
	key     qkey
	waiters []*waiter
	streak  int // urgent grants in a row (see store/internal/lane)

	// What the last claim learned.
	hash      string      // the bucket hash the queue waits on, or ""
	scope     store.Scope // what made it wait
	line      string      // the name of the line it waits in, for pushes ("" none)
	notBefore time.Time   // no claim before then, unless a push or a report comes
	bound     time.Time   // the wait is known to last until then at least
	global    bool        // its wait is the global window's
	push      bool        // only a push (or a report of this process) ends its wait
	urgent    bool        // its last claim was in the urgent lane
	turn      time.Time   // claim then, whatever notBefore and the gate say: a push named its turn in its line, or an urgent waiter came (zero: none)
	lastUse   time.Time   // when a waiter last came or was served
	asked     time.Time   // when the call of its last claim was sent
	missed    time.Time   // when a waiter last left without a slot: its deadline, MaxWait or NoWait came first
	held      string      // the line whose turn, pushed while no waiter was there, the queue keeps for its callers that keep asking ("" none)

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
	at       time.Time // a reserved grant: the request may go then, not before
	err      error
	local    *store.Reservation // granted by the local limiter first, during a grace period
}

func isUrgent(w *waiter) bool { return w.claim.Priority == store.PriorityUrgent }
func isRetry(w *waiter) bool  { return w.claim.Retry }

// add places w in its lane of q (see store/internal/lane), a retry at its
// front.
func (q *lqueue) add(w *waiter) {
	if w.claim.Retry {
		q.waiters = lane.Insert(q.waiters, lane.PlaceRetry(q.waiters, 0, isUrgent(w), isUrgent, isRetry), w)
		return
	}
	q.waiters = lane.Insert(q.waiters, lane.Place(q.waiters, 0, isUrgent(w), isUrgent, q.streak), w)
}

// boundFrom returns how long a new waiter is known to wait at least.
func (q *lqueue) boundFrom(now time.Time) time.Duration {
	if q.bound.After(now) {
		return q.bound.Sub(now)
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

// settle moves w out of the queue with a final state.
func (q *lqueue) settle(w *waiter, state int) {
	w.state = state
	close(w.ready)
}

// compatible reports whether two claims of one queue may share a claim.
func compatible(a, b *store.Claim) bool {
	return a.Global == b.Global && a.GlobalLimit == b.GlobalLimit && a.TokenAuth == b.TokenAuth && a.Spacing == b.Spacing
}

// batch returns how many waiters at the front of q may share a claim with
// the first, at most max: compatible claims of its lane (an urgent claim
// takes a place ahead of the normal ones, in other processes' lines too,
// for its urgent waiters only).
func (q *lqueue) batch(max int) int {
	if len(q.waiters) == 0 {
		return 0
	}
	head := &q.waiters[0].claim
	n := 1
	for n < len(q.waiters) && n < max && compatible(head, &q.waiters[n].claim) && q.waiters[n].claim.Priority == head.Priority {
		n++
	}
	return n
}

// due removes from q the waiters (compatible with head, unless head is
// nil) whose deadline or MaxWait comes before until, or that will not wait
// at all (NoWait) while until is in the future, and returns them, each
// with the reason in err.
func (q *lqueue) due(head *store.Claim, now, until time.Time) []*waiter {
	var out []*waiter
	kept := q.waiters[:0]
	for _, w := range q.waiters {
		var err error
		if head == nil || compatible(head, &w.claim) {
			err = store.Exceeds(!w.deadline.IsZero() && until.After(w.deadline),
				w.claim.MaxWait > 0 && until.After(w.start.Add(w.claim.MaxWait)) || w.claim.NoWait && until.After(now))
		}
		if err == nil {
			kept = append(kept, w)
			continue
		}
		w.err = err
		out = append(out, w)
		q.missed = now
	}
	clear(q.waiters[len(kept):])
	q.waiters = kept
	return out
}

// failDue fails the waiters of q that due returns, each with a wait error
// of bucket and scope that names retry as its wait.
func (q *lqueue) failDue(head *store.Claim, now, until time.Time, bucket string, scope store.Scope, retry time.Duration) {
	for _, w := range q.due(head, now, until) {
		w.err = &store.WaitError{Bucket: bucket, Scope: scope, RetryAfter: retry, Err: w.err}
		q.settle(w, failed)
	}
}

// keepAsking is how recently a waiter of a queue must have left without
// a slot for the queue to count as asking again and again: its caller
// retries (see lqueue.until).
const keepAsking = time.Second

// asking reports whether q's callers keep asking: a waiter of q left
// without a slot in the last keepAsking.
func (q *lqueue) asking(now time.Time) bool {
	return !q.missed.IsZero() && now.Sub(q.missed) < keepAsking
}

// until returns the moment after which none of q's waiters waits any
// longer (its deadline, or its start plus its MaxWait, the later over the
// waiters), or zero when one of them waits without a bound. A place in a
// line is worth holding no longer than that, except for a queue whose
// callers keep asking: one of its waiters left without a slot in the last
// keepAsking. Its next waiter is as good as there when its turn comes, so
// it holds its place as a waiter without a bound would, until its turn
// plus the ticket grace (and gives it up when told its turn with no
// waiter left). Without a place, every such process would claim whenever
// the bucket reopens, each told the wait anew: a claim per process per
// window, where the line serves them in turn with about one.
func (q *lqueue) until(now time.Time) time.Time {
	if q.asking(now) {
		return time.Time{}
	}
	var last time.Time
	for _, w := range q.waiters {
		end := w.deadline
		if w.claim.NoWait {
			end = w.start
		} else if w.claim.MaxWait > 0 {
			if m := w.start.Add(w.claim.MaxWait); end.IsZero() || m.Before(end) {
				end = m
			}
		}
		if end.IsZero() {
			return time.Time{}
		}
		if end.After(last) {
			last = end
		}
	}
	return last
}

// fail settles the waiters of q that made the same claim as head with err.
func (q *lqueue) fail(head *store.Claim, err error) {
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

// scopeOf names the scope of a wait reply's code.
func scopeOf(code int) store.Scope {
	switch code {
	case waitGlobal:
		return store.ScopeGlobal
	case waitPause:
		return store.ScopeShared
	}
	return store.ScopeUser
}
