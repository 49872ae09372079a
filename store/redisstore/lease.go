package redisstore

import (
	"time"

	"github.com/ratecord/ratecord/store"
)

// A queue that claims again soon after a grant (a hot route) asks for a
// few slots beyond its waiters: a lease, which the next waiters of the
// queue take without a round trip. The claim lends extra slots only when
// no other process waits on the bucket, at least 64 slots are free beyond
// the claim's waiters, and at most a quarter of what is free in the
// bucket and in the global window, so a lease never keeps a slot that
// another process is waiting for. Discord's buckets are mostly small:
// leases serve the large ones, and the global limit of large bots. Unused slots go back after
// leaseTTL, well inside the offset by which a request may reach Discord
// after its grant (its global slot counts that long), and the lease
// shrinks; a lease used up before then grows, up to the Store's lease
// size ([WithLease]). A response of the queue that answers 429 or shows
// few slots left revokes it; what other processes learn meanwhile reaches
// the lease only when it ends.
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
// and returns those it does not keep; s.mu must be held.
func (s *Store) keepLease(q *lqueue, head *store.Claim, surplus []grant) []grant {
	now := time.Now()
	q.lastGrant = now
	if len(surplus) == 0 || q.leaseWant == 0 || s.closed {
		return surplus
	}
	keep := min(len(surplus), q.leaseWant)
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

// takeLease empties q's lease and returns its slots; s.mu must be held.
func (q *lqueue) takeLease() []grant {
	l := q.lease
	q.lease = nil
	return l
}

// leaseExpiry returns a channel that fires when q's lease ends, or nil
// without one; s.mu must be held.
func (s *Store) leaseExpiry(q *lqueue) <-chan time.Time {
	if len(q.lease) == 0 {
		return nil
	}
	return time.After(time.Until(q.leaseUntil))
}

// expireLease gives back what is left of q's lease once it has ended, and
// halves the lease the next claim asks for.
func (s *Store) expireLease(q *lqueue) {
	s.mu.Lock()
	var back []grant
	if len(q.lease) > 0 && !time.Now().Before(q.leaseUntil) {
		back = q.takeLease()
		q.leaseWant /= 2
	}
	s.mu.Unlock()
	s.giveBackAll(back)
}

// giveBackAll returns permits nobody will use.
func (s *Store) giveBackAll(ps []grant) {
	for _, p := range ps {
		s.giveBack(p)
	}
}

// revokeLease gives back the lease of the queue of permit h when the
// response u answered 429 (a pause, a hidden limit), gave no limits, or
// says the bucket has no more than twice the lease's slots left (a limit
// was lowered, or others spent them). Slots of a lease that nobody used go
// back only as settled, not as free: a response since the grant may have
// set the bucket's count without them.
func (s *Store) revokeLease(h *permit, u *store.Update) {
	if !u.Sent {
		return
	}
	s.mu.Lock()
	q := s.queues[qkey{cred: h.cred, route: h.route, major: h.major, kind: h.sub}]
	var back []grant
	if q != nil && len(q.lease) > 0 && (u.Status == 429 || !u.HasLimit || u.Remaining <= 2*len(q.lease)) {
		back = q.takeLease()
		q.leaseWant = 0
	}
	s.mu.Unlock()
	s.giveBackAll(back)
}
