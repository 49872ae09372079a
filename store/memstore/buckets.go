package memstore

import (
	"sync/atomic"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/model"
)

// route is what was learned about a route template.
type route struct {
	hash string // learned bucket hash; "" while unknown
	none bool   // the route answers without rate-limit headers
	seen int64
	last *bucket // the bucket this route resolved to last, to skip a lookup
}

// bkey names a counter. Learned buckets have hash set and route empty; the
// probe bucket of a route whose hash is not known yet has route set.
type bkey struct {
	hash, route, major string
}

// bucket is one counter, (credential, hash, major parameter), with its
// waiters. Its rules are the model's.
type bucket struct {
	model.Bucket
	key      bkey
	c        *cred
	removed  bool // swept: no longer in the credential's map
	q        queue
	alarm    alarm // pumps the bucket when time alone may open it
	lastUsed int64
	// recalled is when (ms) a response last spent the bucket while it had
	// grants out (see spent): a grant from before then that has not left
	// is taken back ([Store.Lapsed]). Read without the lock.
	recalled atomic.Int64
}

// spent reports whether b refuses at now what its grants out assumed: a
// 429 paused it, or (lowered, a response lowered its limit) what its
// fixed window holds is below what was granted from it. A count that only
// looks short because requests are still in flight is not spent: the model
// subtracts them whether or not Discord counted them already.
func (b *bucket) spent(now int64, lowered bool) bool {
	return now < b.Pause || lowered && b.Known && !b.Sliding && b.Remaining < 0 && now < b.ResetAt
}

// recall marks, at now, the grants out of b as taken back when a response
// spent it (see spent), limit being b's limit before the response: a
// grant that has not left by the time its caller checks
// ([store.Reservation.Lapsed]) is given back and claimed again, at the
// front of its line, instead of meeting the 429 another request met.
func (b *bucket) recall(now, limit int64) {
	if b != nil && b.Pending > 0 && b.spent(now, b.Limit < limit) {
		b.recalled.Store(now)
	}
}

// limitOf returns b's limit, 0 for none.
func limitOf(b *bucket) int64 {
	if b == nil {
		return 0
	}
	return b.Limit
}

// available reports whether b grants a slot at now: the model's answer,
// less the slots b keeps for probes (see kept).
func (b *bucket) available(now int64) bool {
	if !b.Available(now) {
		return false
	}
	k, _ := b.kept(now)
	return k == 0 || b.Room(now, k+1) > k
}

// kept returns how many slots the known bucket b keeps at now for the
// requests in flight on routes of its major whose bucket is not known yet
// (probes): such a route may turn out to share b, and Discord then counts
// its request in b's window. A probe's slot is kept until its answer, or
// until it is overdue (see [model.ReportSlack]); the answer of a probe
// that shares b lowers b's count like any response of b. It also returns
// when the kept slots come back at the latest (0 when none are kept).
func (b *bucket) kept(now int64) (n, until int64) {
	if b.c == nil || len(b.c.probes) == 0 || b.Probe || !b.Known || b.Unlimited {
		return 0, 0 // the fast path: no probe of the credential in flight
	}
	if p := b.c.probes[b.key.major]; p.n > 0 && now < p.until {
		return p.n, p.until
	}
	return 0, 0
}

// probing counts the requests in flight on the probe buckets of one major.
type probing struct {
	n     int64 // requests in flight
	until int64 // when the last of them is overdue (ms)
}

// take grants a slot, counting a probe's request against its major; reach
// is the store's hold (see [model.Bucket.Aged]).
func (b *bucket) take(now, reach int64) {
	b.Take(now, reach)
	if b.Probe {
		p := b.c.probes[b.key.major]
		p.n++
		p.until = max(p.until, b.ArriveBy+model.ReportSlack)
		b.c.probes[b.key.major] = p
	}
}

// settle counts a granted request as answered.
func (b *bucket) settle() {
	b.unprobe()
	b.Settle()
}

// unanswered settles a request sent at or before now that got no response.
func (b *bucket) unanswered(now int64) {
	b.unprobe()
	b.Unanswered(now)
}

// giveBack returns a slot taken by a request that was never sent.
func (b *bucket) giveBack(now int64) {
	b.unprobe()
	b.GiveBack(now)
}

// unprobe stops counting one of a probe's requests against its major.
func (b *bucket) unprobe() {
	if b.Pending > 0 && b.Probe {
		p := b.c.probes[b.key.major]
		if p.n--; p.n <= 0 {
			delete(b.c.probes, b.key.major)
		} else {
			b.c.probes[b.key.major] = p
		}
	}
}

// route returns what is known of route name, creating it, and marks it
// used at now.
func (s *Store) route(cr *cred, name string, now int64) *route {
	r := cr.routes[name]
	if r == nil {
		r = &route{}
		cr.routes[name] = r
		s.nroutes++
		s.armSweep(now) // sooner when the store now holds more routes than it keeps idle
	}
	r.seen = now
	return r
}

// resolve returns the bucket a request on route and major counts against,
// creating it.
func (s *Store) resolve(cr *cred, routeName, major string, now int64) *bucket {
	r := s.route(cr, routeName, now)
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
		if probe := cr.buckets[bkey{route: routeName, major: major}]; probe != nil && probe.Pending > 0 {
			return probe
		}
	}
	if b == nil {
		b = cr.newBucket(k, now)
		b.Probe = k.route != ""
		cr.buckets[k] = b
		s.nbuckets++
	}
	b.lastUsed = now
	if r.hash != "" && b.key.hash == r.hash {
		r.last = b
	}
	return b
}

// newBucket returns a new bucket of cr named k, paused while cr holds the
// requests of an exhausted bucket it forgot (see fold.go).
func (cr *cred) newBucket(k bkey, now int64) *bucket {
	b := &bucket{key: k, c: cr}
	if cr.until > now {
		b.Pause = cr.until
	}
	return b
}

// unlimited returns the credential's bucket for routes without one: it
// never runs out, but pauses like any other.
func (s *Store) unlimited(cr *cred, now int64) *bucket {
	k := bkey{route: "\x00none"}
	b := cr.buckets[k]
	if b == nil {
		b = cr.newBucket(k, now)
		b.Unlimited = true
		cr.buckets[k] = b
		s.nbuckets++
	}
	b.lastUsed = now
	return b
}

// learn applies what a response teaches about its route and returns the
// bucket the response concerns: the one it names, the one it was granted
// from, or nil when the route turned out to have none.
func (s *Store) learn(cr *cred, granted *bucket, c *store.Claim, u *store.Update, now int64) *bucket {
	r := s.route(cr, c.Route, now)
	learned := model.LearnRoute(r.hash, r.none, u.Bucket, int64(u.Status), u.HasLimit)
	switch learned {
	case model.RouteLearned:
		r.hash, r.none = u.Bucket, false
	case model.RouteNone:
		r.none = true
	}
	if learned != model.RouteSame && granted != nil && granted.Probe {
		granted.Retired = true
	}
	switch {
	case u.Bucket != "":
		return s.resolve(cr, c.Route, c.Major, now)
	case learned == model.RouteNone:
		return nil // bound by the global limit only
	}
	return granted
}
