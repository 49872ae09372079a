package redisstore

import (
	"time"

	"github.com/ratecord/ratecord/store"
)

// A queue that claims again soon after a grant (a hot route) asks for a
// few slots beyond its waiters: a lease, which the next waiters of the
// queue take without a round trip. The claim lends extra slots only when
// no other process waits on the bucket or the global window, at least 64
// slots are free beyond the claim's waiters, and at most a quarter of what
// is free in the global window, so a lease never keeps a slot that another
// process is waiting for. Discord's buckets are mostly small: leases serve
// the large ones, and the global limit of large bots. Unused slots go back
// after leaseTTL, well inside the time by which a request may reach
// Discord after its grant (its global slot counts that long), and the
// lease shrinks; a lease used up before then grows, up to the Store's
// lease size ([WithLease]). A response of the queue that answers 429 or
// shows few slots left revokes it; what other processes learn meanwhile
// reaches the lease only when it ends.
const leaseTTL = 25 * time.Millisecond

// leaseFor returns how many extra slots the next claim of q asks for;
// s.mu must be held.
func (s *Store) leaseFor(q *lqueue, now time.Time) int {
	if s.leaseMax <= 0 || s.inGrace(now) {
		return 0
	}
	if !q.lastGrant.IsZero() && now.Sub(q.lastGrant) < leaseTTL && len(q.lease) == 0 {
		// Claimed again soon after a grant, the lease (if any) used up.
		q.leaseWant = min(max(1, 2*q.leaseWant), s.leaseMax)
	}
	return q.leaseWant
}

// keepLease keeps the slots of a grant that no waiter took as q's lease
// (extra of them were asked for a lease) and returns those it does not
// keep; s.mu must be held.
func (s *Store) keepLease(q *lqueue, head *store.Claim, surplus []grant, extra int, now time.Time) []grant {
	q.lastGrant = now
	if len(surplus) == 0 || s.closed {
		return surplus
	}
	// Slots asked for waiters who gave up during the round trip are kept
	// too: a caller that retries at once takes one.
	keep := min(len(surplus), max(q.leaseWant, len(surplus)-extra))
	for _, p := range surplus[:keep] {
		p.Handle.(*permit).lent = true
	}
	back := surplus[keep:]
	old := q.takeLease()
	q.lease = append(q.lease, surplus[:keep]...)
	q.leaseClaim = *head
	q.leaseUntil = now.Add(leaseTTL)
	return append(back, old...)
}

// leased hands c a slot of q's lease, if one is left for claims like c;
// s.mu must be held.
func (q *lqueue) leased(c *store.Claim, now time.Time) (grant, bool) {
	if len(q.lease) == 0 || len(q.waiters) > 0 || !now.Before(q.leaseUntil) || !compatible(&q.leaseClaim, c) {
		return grant{}, false
	}
	p := q.lease[0]
	q.lease[0] = grant{}
	q.lease = q.lease[1:]
	p.Handle.(*permit).lent = false
	return p, true
}

// keepSlot adds the slot p, granted for a claim like c to a waiter that
// gave up before it could take it, to q's lease, and reports whether it
// did; s.mu must be held.
func (s *Store) keepSlot(q *lqueue, c *store.Claim, p grant, now time.Time) bool {
	h, ok := p.Handle.(*permit)
	if !ok || len(q.lease) > 0 && !compatible(&q.leaseClaim, c) {
		return false
	}
	h.lent = true
	if len(q.lease) == 0 {
		q.leaseClaim = *c
		q.leaseUntil = now.Add(leaseTTL)
	}
	q.lease = append(q.lease, p)
	return true
}

// serveLease hands the slots of q's lease to the waiters at its front, in
// order, as far as they are compatible; s.mu must be held.
func (s *Store) serveLease(q *lqueue, now time.Time) {
	for len(q.lease) > 0 && len(q.waiters) > 0 && now.Before(q.leaseUntil) && compatible(&q.leaseClaim, &q.waiters[0].claim) {
		w := q.waiters[0]
		q.waiters = q.waiters[1:]
		p := q.lease[0]
		q.lease[0] = grant{}
		q.lease = q.lease[1:]
		p.Handle.(*permit).lent = false
		w.permit = p
		q.settle(w, granted)
	}
}

// takeLease empties q's lease and returns its slots; s.mu must be held.
func (q *lqueue) takeLease() []grant {
	l := q.lease
	q.lease = nil
	return l
}

// expireLeases gives back what is left of the leases of ss that have
// ended, and halves the lease their queues ask for next; s.mu must be
// held.
func (s *Store) expireLeases(ss *session, now time.Time) {
	for _, q := range ss.queues {
		if len(q.lease) > 0 && !now.Before(q.leaseUntil) {
			for _, p := range q.takeLease() {
				s.giveBackLocked(ss, p)
			}
			q.leaseWant /= 2
		}
	}
}

// revokeLease gives back the lease of the queue of permit h when the
// response u answered 429 (a pause, a hidden limit), gave no limits, or
// says the bucket has no more than twice the lease's slots left (a limit
// was lowered, or others spent them). Slots of a lease that nobody used go
// back only as settled, not as free: a response since the grant may have
// set the bucket's count without them. s.mu must be held.
func (s *Store) revokeLease(ss *session, h *permit, u *store.Update) {
	if !u.Sent {
		return
	}
	q := ss.queues[qkey{route: h.route, major: h.major, kind: h.sub}]
	if q != nil && len(q.lease) > 0 && (u.Status == 429 || !u.HasLimit || u.Remaining <= 2*len(q.lease)) {
		for _, p := range q.takeLease() {
			s.giveBackLocked(ss, p)
		}
		q.leaseWant = 0
	}
}
