package discordtest

import (
	"net/http"
	"strconv"
	"time"
)

// sweepEvery is how often, in emulator time, idle counters are dropped.
const sweepEvery = 10 * time.Second

// discordEpoch is the start of Discord's snowflakes, in Unix milliseconds.
const discordEpoch = 1420070400000

// Scopes of a 429, as sent in X-RateLimit-Scope and counted in
// [Stats].ByScope.
const (
	// ScopeUser is a credential exceeding a bucket or a hidden sublimit.
	ScopeUser = "user"
	// ScopeGlobal is a credential exceeding its global limit.
	ScopeGlobal = "global"
	// ScopeShared is a resource busy for everyone; see [SharedLimit].
	ScopeShared = "shared"
)

// counterKind says which limit a counter enforces.
type counterKind uint8

const (
	kindBucket     counterKind = iota // cred, hash, major
	kindGlobal                        // cred
	kindShared                        // hash = index of the SharedLimit, major = the resource it matched
	kindSublimit                      // major = channels/{id}
	kindInvalid                       // cred = client IP
	kindEdge                          // cred = client IP, hash = index of the EdgeLimit
	kindEdgeStrike                    // cred = client IP, hash = index of the EdgeLimit: requests into its blocks
	kindBare                          // cred, hash = index of the BareLimit, major
)

// counterKey names one counter.
type counterKey struct {
	kind  counterKind
	cred  string
	hash  string
	major string
}

// deliveredKey names a bucket as seen by one credential through one route:
// a client learns which bucket a route uses only from that route's
// responses.
type deliveredKey struct {
	cred  string
	hash  string
	route string
}

// renameKey names the renames of one channel by one credential, for telling
// avoidable sublimit 429s apart.
type renameKey struct {
	cred    string
	channel string // channels/{id}
}

// waitTold is a 429 that named a wait, sent to a credential: when it
// reached which process of the client, and when the wait it named ran out,
// counted from the decision.
type waitTold struct {
	reached
	end time.Time
}

// maxWaitTold bounds the 429s remembered per counter (per credential and
// channel for the sublimit); the newest are kept.
const maxWaitTold = 16

// result is the emulator's decision about one request.
type result struct {
	decided   time.Time
	status    int
	scope     string        // scope of a 429, "" otherwise
	retry     time.Duration // retry_after of a 429
	headers   *bucketHeaders
	banned    bool       // the client IP is banned: Cloudflare's 429
	edge      bool       // an edge limit blocks the client IP: Cloudflare's JSON 429
	edgeBody  *edgeLimit // the edge limit whose 429 it is, which says its body
	bare      bool       // a bare limit refuses: Retry-After and nothing else
	avoidable bool       // a 429 the client could have avoided
	route     string
	hash      string
	code      int       // Discord error code of a 404 or 401
	message   string    // Discord error message of a 404 or 401
	id        string    // snowflake for a created object
	gateway   int       // max_concurrency for the body of GET /gateway/bot, 0 otherwise
	reached   time.Time // when the response is due at the client
	entry     int       // number of the log entry, -1 when not logged
	// told are what the response tells its client, moved under the lock
	// to the time it is written (a sleep can overrun the planned end of the
	// way down), or marked lost when it never is.
	told []*reached
}

// named returns the wait a 429 named: whole seconds for a bare one,
// retry_after for one with a scope, zero otherwise.
func (res *result) named() time.Duration {
	switch {
	case res.bare:
		return wholeSeconds(res.retry)
	case res.scope != "":
		return res.retry
	}
	return 0
}

// bucketHeaders are the values of the X-RateLimit-* headers of a bucket.
type bucketHeaders struct {
	hash       string
	limit      int
	remaining  int
	resetAfter time.Duration
}

// decide takes the decision about one request under the lock and records it
// in the stats. It is called when the request arrives at Discord, once the
// network's way up has passed: that moment counts. back is the delay of the
// way down still to come, used to tell when the response reaches the client.
func (s *Server) decide(q *request, back time.Duration) result {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	s.sweep(now)
	res := s.judge(q, now, back)
	res.decided, res.reached = now, now.Add(back)
	s.record(q, &res)
	return res
}

// judge applies the limits in Discord's order: Cloudflare ban, edge limits,
// token, global limit, shared resource, bucket, hidden sublimit, then the
// resource itself.
func (s *Server) judge(q *request, now time.Time, back time.Duration) result {
	var res result
	var b Bucket
	var hasBucket bool
	if rt := matchRoute(s.routes, q.method, q.segs); rt != nil {
		res.route, res.hash = rt.tmpl.text, rt.hash
		b, hasBucket = s.buckets[rt.hash]
	} else {
		res.route = q.safePath()
	}
	if until, ok := s.bans[q.ip]; ok && now.Before(until) {
		res.banned, res.status = true, http.StatusTooManyRequests
		return res
	}
	if s.judgeEdge(q, &res, now, back) {
		return res
	}

	// GET /gateway/bot tells a bot about its own gateway: no token, no answer.
	if !s.authorized(q.auth) || (q.auth == "" && isGatewayBot(q)) {
		res.status, res.code, res.message = http.StatusUnauthorized, 0, "401: Unauthorized"
		s.countInvalid(q.ip, now)
		return res
	}

	if !q.exempt && s.globalLimit > 0 {
		key := counterKey{kind: kindGlobal, cred: q.cred}
		gc, gl := s.counter(key, false), s.limitsFor(key)
		if ok, wait := take(gc, now, gl); !ok {
			res.status, res.scope, res.retry = http.StatusTooManyRequests, ScopeGlobal, wait
			res.avoidable = !q.frozen && !s.lateFilled(key, gc, now, gl)
			s.countInvalid(q.ip, now)
			return res
		}
		s.addLate(q, key, now, gl)
	}

	var c counter
	var l limits
	if hasBucket {
		key := counterKey{kind: kindBucket, cred: q.cred, hash: b.Hash, major: q.major}
		c, l = s.counter(key, b.Fixed), s.limitsFor(key)
	}

	if ok, wait, retry := s.takeShared(q, now); !ok {
		res.status, res.scope, res.retry = http.StatusTooManyRequests, ScopeShared, max(wait, retry)
		s.announce(&res, q, b, c, l, now, back)
		return res
	}

	if c != nil {
		if ok, wait := c.check(now, l); !ok {
			res.status, res.scope, res.retry = http.StatusTooManyRequests, ScopeUser, wait
			switch {
			case b.Claim.claims():
				res.avoidable = s.toldByClaim(&res, q, b, now, back)
			case b.overstates():
				key := counterKey{kind: kindBucket, cred: q.cred, hash: b.Hash, major: q.major}
				res.avoidable = s.toldToWait(key, &res, q, now, back, wait)
			default:
				key := counterKey{kind: kindBucket, cred: q.cred, hash: b.Hash, major: q.major}
				res.avoidable = !q.frozen && !s.lateFilled(key, c, now, l) &&
					s.knewAny(s.delivered[deliveredKey{cred: q.cred, hash: b.Hash, route: res.route}], q)
			}
			s.countInvalid(q.ip, now)
			s.announce(&res, q, b, c, l, now, back)
			return res
		}
	}

	if key, wait, ok := s.checkBare(q, now); !ok {
		res.status, res.bare, res.retry = http.StatusTooManyRequests, true, wait
		res.avoidable = s.toldToWait(key, &res, q, now, back, wholeSeconds(wait))
		s.countInvalid(q.ip, now)
		return res
	}

	if q.renames && s.cfg.sublimit > 0 {
		key := counterKey{kind: kindSublimit, major: q.resource}
		if ok, wait := take(s.counter(key, true), now, s.limitsFor(key)); !ok {
			res.status, res.scope, res.retry = http.StatusTooManyRequests, ScopeUser, wait
			res.avoidable = s.toldOfRename(&res, q, now, back, wait)
			s.countInvalid(q.ip, now)
			s.announce(&res, q, b, c, l, now, back)
			return res
		}
	}

	if c != nil {
		c.add(now, l)
		s.addLate(q, counterKey{kind: kindBucket, cred: q.cred, hash: b.Hash, major: q.major}, now, l)
		s.announce(&res, q, b, c, l, now, back)
	}
	s.addBare(q, now)

	if s.gone(q, &res, now) {
		return res
	}
	res.status = successStatus(q, hasBucket)
	if res.status == http.StatusOK {
		res.id = s.snowflake(now)
	}
	if isGatewayBot(q) {
		res.gateway = s.maxConcurrency
	}
	return res
}

// toldByClaim reports whether a bucket whose headers make a claim had
// already refused the credential on the same major parameter with a 429
// that q's process knew of when q was sent (see [Server.knew]): headers that
// claim room the bucket does not have are no excuse for repeating a 429. It
// remembers this 429's arrival at q's process.
func (s *Server) toldByClaim(res *result, q *request, b Bucket, now time.Time, back time.Duration) bool {
	key := counterKey{kind: kindBucket, cred: q.cred, hash: b.Hash, major: q.major}
	told := s.claimTold[key]
	avoidable := s.knewAny(told, q)
	told.add(res, q.process, now.Add(back))
	s.claimTold[key] = told
	return avoidable
}

// toldOfRename reports whether a rename refused by the hidden sublimit was
// sent knowing an earlier sublimit 429 on the same channel to the same
// credential and before its retry_after had run out; see [Server.toldWait].
func (s *Server) toldOfRename(res *result, q *request, now time.Time, back, wait time.Duration) bool {
	key := renameKey{cred: q.cred, channel: q.resource}
	avoidable, told := s.toldWait(s.renameTold[key], res, q, now, back, wait)
	s.renameTold[key] = told
	return avoidable
}

// toldToWait is [Server.toldOfRename] for the 429s of one counter: of a
// bucket whose headers overstate its limit, or of a bare limit.
func (s *Server) toldToWait(key counterKey, res *result, q *request, now time.Time, back, wait time.Duration) bool {
	avoidable, told := s.toldWait(s.waitTold[key], res, q, now, back, wait)
	s.waitTold[key] = told
	return avoidable
}

// toldWait reports whether q was sent after its process knew of one of
// the 429s told (see [Server.knew]) and before the wait that 429 named had
// run out, counted from when the emulator decided it. It returns told with
// this 429, which names wait, added.
func (s *Server) toldWait(told []*waitTold, res *result, q *request, now time.Time, back, wait time.Duration) (bool, []*waitTold) {
	avoidable := false
	for _, t := range told {
		if s.knew(t.reached, q) && q.sent.Before(t.end) {
			avoidable = true
			break
		}
	}
	if len(told) >= maxWaitTold {
		told = append(told[:0], told[1:]...)
	}
	t := &waitTold{reached: reached{at: now.Add(back), by: q.process}, end: now.Add(wait)}
	onWrite(res, &t.reached)
	return avoidable, append(told, t)
}

// checkBare reports whether q fits every bare limit of its route. When one
// is full it returns false, that limit's counter and the time until its
// window ends.
func (s *Server) checkBare(q *request, now time.Time) (key counterKey, wait time.Duration, ok bool) {
	for i := range s.bare {
		if !s.bare[i].tmpl.match(q.method, q.segs) {
			continue
		}
		key := counterKey{kind: kindBare, cred: q.cred, hash: strconv.Itoa(i), major: q.major}
		if ok, wait := s.counter(key, true).check(now, s.limitsFor(key)); !ok {
			return key, wait, false
		}
	}
	return counterKey{}, 0, true
}

// addBare counts q on every bare limit of its route.
func (s *Server) addBare(q *request, now time.Time) {
	for i := range s.bare {
		if s.bare[i].tmpl.match(q.method, q.segs) {
			key := counterKey{kind: kindBare, cred: q.cred, hash: strconv.Itoa(i), major: q.major}
			s.counter(key, true).add(now, s.limitsFor(key))
		}
	}
}

// wholeSeconds rounds d up to whole seconds, as Retry-After says it.
func wholeSeconds(d time.Duration) time.Duration {
	return time.Duration(ceilMillis(d)+999) / 1000 * time.Second
}

// authorized reports whether an Authorization value is accepted. Requests
// without one are accepted and limited per client IP.
func (s *Server) authorized(auth string) bool {
	if auth == "" {
		return true
	}
	t := bareToken(auth)
	if s.invalidTokens[t] {
		return false
	}
	return len(s.tokens) == 0 || s.tokens[t]
}

// takeShared counts a request against the shared limits of its resource. When
// one is full it returns false, the time until its window frees a slot and the
// configured retry_after.
func (s *Server) takeShared(q *request, now time.Time) (ok bool, wait, retry time.Duration) {
	for i := range s.shared {
		sh := &s.shared[i]
		resource := sh.match(q)
		if resource == "" {
			continue
		}
		key := counterKey{kind: kindShared, hash: strconv.Itoa(i), major: resource}
		if ok, wait := take(s.counter(key, true), now, s.limitsFor(key)); !ok {
			return false, wait, s.scale(sh.RetryAfter)
		}
	}
	return true, 0, 0
}

// announce puts a bucket's headers on a response and remembers when they
// reach the credential's process, for telling avoidable 429s from
// unavoidable ones.
func (s *Server) announce(res *result, q *request, b Bucket, c counter, l limits, now time.Time, back time.Duration) {
	if c == nil {
		return
	}
	st := c.state(now, l)
	h := &bucketHeaders{hash: b.Hash, limit: b.Limit, remaining: st.remaining, resetAfter: st.resetAfter}
	switch {
	case b.Claim.claims():
		h.limit, h.remaining, h.resetAfter = b.Claim.Limit, b.Claim.Remaining, s.scale(b.Claim.ResetAfter)
	case b.overstates():
		// Counted down from the announced limit: what the window holds
		// taken from it, and nothing left once the real limit refuses.
		h.limit, h.remaining = b.Announced, max(0, b.Announced-(b.Limit-st.remaining))
		if res.status == http.StatusTooManyRequests {
			h.remaining = 0
		}
	case b.Announced > 0:
		h.limit = b.Announced
		h.remaining = min(h.remaining, b.Announced)
	}
	res.headers = h
	key := deliveredKey{cred: q.cred, hash: b.Hash, route: res.route}
	told := s.delivered[key]
	told.add(res, q.process, now.Add(back))
	s.delivered[key] = told
}

// gone sets a 404 when the request's channel or webhook was deleted.
func (s *Server) gone(q *request, res *result, now time.Time) bool {
	if len(q.segs) < 2 {
		return false
	}
	switch {
	case q.segs[0] == "channels" && s.deletedChannels[q.segs[1]]:
		res.status, res.code, res.message = http.StatusNotFound, 10003, "Unknown Channel"
	case q.segs[0] == "webhooks" && s.deletedWebhooks[q.segs[1]]:
		res.status, res.code, res.message = http.StatusNotFound, 10015, "Unknown Webhook"
		s.countInvalid(q.ip, now)
	default:
		return false
	}
	return true
}

// successStatus is the status of a successful request: 204 where Discord
// sends no content, 200 otherwise. Routes outside the table always get 200.
func successStatus(q *request, hasBucket bool) int {
	if !hasBucket {
		return http.StatusOK
	}
	s := q.segs
	switch {
	case q.method == http.MethodDelete:
		return http.StatusNoContent
	case q.method == http.MethodPut && len(s) >= 4 && (s[len(s)-2] == "roles" || s[len(s)-2] == "bans" || contains(s, "reactions")):
		return http.StatusNoContent
	case q.method == http.MethodPost && len(s) == 4 && s[0] == "interactions" && s[3] == "callback":
		return http.StatusNoContent
	case q.method == http.MethodPost && len(s) == 3 && s[0] == "webhooks" && !q.wait:
		return http.StatusNoContent
	}
	return http.StatusOK
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// countInvalid counts an invalid request from ip and bans the IP once it has
// more than the limit within the window.
func (s *Server) countInvalid(ip string, now time.Time) {
	s.stats.invalid++
	if s.cfg.invalidLimit <= 0 {
		return
	}
	key := counterKey{kind: kindInvalid, cred: ip}
	l := s.limitsFor(key)
	log := s.counter(key, false).(*slidingLog)
	log.add(now, l)
	if log.count(now, l) > l.limit {
		s.ban(ip, now)
	}
}

// A request frozen in flight (see request.frozen) left its process under
// the limits as that process knew them and arrived after the process had
// been stopped for a while: its window may have been filled meanwhile by the
// other processes, which were right to use what the stopped one had not
// sent in time. Its own 429 of the global limit or a bucket is therefore
// unavoidable, and so is a 429 of another request of a window that would
// have had room without the requests frozen in flight it counts. Nothing
// else is forgiven: such requests are rare (a process stopped in the
// moment between handing a request to the network and writing it), and
// Stats.Frozen counts them.

// addLate records that q, counted by the counter of key at now, was frozen
// in flight.
func (s *Server) addLate(q *request, key counterKey, now time.Time, l limits) {
	if !q.frozen {
		return
	}
	g, ok := s.late[key]
	if !ok {
		if s.late == nil {
			s.late = make(map[counterKey]*slidingLog)
		}
		g = &slidingLog{}
		s.late[key] = g
	}
	g.add(now, l)
}

// lateFilled reports whether c, the counter of key, refused a request at now
// only because of requests frozen in flight it counts: without them it
// would have had room.
func (s *Server) lateFilled(key counterKey, c counter, now time.Time, l limits) bool {
	g, ok := s.late[key]
	if !ok {
		return false
	}
	late := g.count(now, l)
	if f, ok := c.(*fixedWindow); ok {
		// Only those of its current window.
		late = 0
		for _, t := range g.times {
			if !t.Before(f.start) {
				late++
			}
		}
	}
	used := l.limit - c.state(now, l).remaining
	return late > 0 && used-late < l.limit
}

// counter returns the counter for key, creating it, or replacing it when a
// bucket switched between fixed and sliding.
func (s *Server) counter(key counterKey, fixed bool) counter {
	c, ok := s.counters[key]
	if ok && key.kind == kindBucket {
		_, isFixed := c.(*fixedWindow)
		ok = isFixed == fixed
	}
	if ok {
		return c
	}
	switch {
	case key.kind == kindGlobal || key.kind == kindInvalid || key.kind == kindEdge || key.kind == kindEdgeStrike:
		c = &slidingLog{}
	case fixed || key.kind == kindBare:
		c = &fixedWindow{}
	default:
		c = &slidingWindow{}
	}
	s.counters[key] = c
	return c
}

// limitsFor returns the current, scaled limits of a counter.
func (s *Server) limitsFor(key counterKey) limits {
	switch key.kind {
	case kindBucket:
		b := s.buckets[key.hash]
		return limits{limit: b.Limit, window: s.scale(b.Window)}
	case kindGlobal:
		return limits{limit: s.globalLimit, window: s.scale(time.Second)}
	case kindShared:
		i, _ := strconv.Atoi(key.hash)
		sh := s.shared[i]
		return limits{limit: sh.Limit, window: s.scale(sh.Window)}
	case kindSublimit:
		return limits{limit: s.cfg.sublimit, window: s.scale(s.cfg.sublimitWindow)}
	case kindEdge:
		i, _ := strconv.Atoi(key.hash)
		e := s.edge[i]
		return limits{limit: e.Limit, window: s.scale(e.Window)}
	case kindEdgeStrike:
		i, _ := strconv.Atoi(key.hash)
		e := s.edge[i]
		return limits{limit: e.BanAfter, window: s.scale(e.Block)}
	case kindBare:
		i, _ := strconv.Atoi(key.hash)
		b := s.bare[i]
		return limits{limit: b.Limit, window: s.scale(b.Window)}
	default:
		return limits{limit: s.cfg.invalidLimit, window: s.scale(s.cfg.invalidWindow)}
	}
}

// sweep drops, every sweepEvery, the counters that have fully reset, ended
// bans and edge blocks, what clients were told about buckets they no longer
// have a counter for, and 429s of the sublimit, of overstating buckets and
// of bare limits whose wait ran out more than sweepEvery ago, so memory
// stays bounded by recent traffic.
func (s *Server) sweep(now time.Time) {
	if now.Sub(s.lastSweep) < sweepEvery {
		return
	}
	s.lastSweep = now
	live := make(map[deliveredKey]bool) // by credential and hash; route left empty
	for key, c := range s.counters {
		if c.idle(now, s.limitsFor(key)) {
			delete(s.counters, key)
			continue
		}
		if key.kind == kindBucket {
			live[deliveredKey{cred: key.cred, hash: key.hash}] = true
		}
	}
	for key, g := range s.late {
		if g.idle(now, s.limitsFor(key)) {
			delete(s.late, key)
		}
	}
	for key := range s.delivered {
		if !live[deliveredKey{cred: key.cred, hash: key.hash}] {
			delete(s.delivered, key)
		}
	}
	for key := range s.claimTold {
		if _, ok := s.counters[key]; !ok {
			delete(s.claimTold, key)
		}
	}
	for key, told := range s.waitTold {
		if len(told) == 0 || told[len(told)-1].end.Before(now.Add(-sweepEvery)) {
			delete(s.waitTold, key)
		}
	}
	for key, told := range s.renameTold {
		if len(told) == 0 || told[len(told)-1].end.Before(now.Add(-sweepEvery)) {
			delete(s.renameTold, key)
		}
	}
	for key, ep := range s.edgeBlocks {
		if !now.Before(ep.until) {
			delete(s.edgeBlocks, key)
		}
	}
	for ip, until := range s.bans {
		if !now.Before(until) {
			delete(s.bans, ip)
		}
	}
}

// snowflake returns a new snowflake for an object created at now.
func (s *Server) snowflake(now time.Time) string {
	s.seq++
	ms := max(now.UnixMilli()-discordEpoch, 0)
	return strconv.FormatInt(ms<<22|(1<<17)|(s.seq&0xfff), 10)
}
