package discordtest

import (
	"maps"
	"net/http"
	"time"
)

// Stats is a snapshot of what the emulator has answered since it started or
// since the last [Server.ResetStats]. The maps and the log are copies that
// the caller owns.
//
// A 429 is avoidable when a client respecting the rate limits would not have
// got it. Most of the rules below ask whether the request was sent knowing an
// earlier response. A response reaches the process that sent its request
// when the way down of the [Network] has passed and the response is written
// ([ProcessHeader] names a client's processes; requests without it are one
// process per client IP). A request was sent knowing it when it was sent at
// least a millisecond later from that process (a process needs that long to
// read a response before it can hold back a request already on its way), or
// at least the propagation allowance later from another process of the same
// client (5 ms by default, see [WithPropagation]; the client is the
// credential, or for an edge limit the client IP, whatever the token). A
// request sent sooner was already on its way: that response does not make
// its 429 avoidable. A response whose client went away before it was written
// (see Lost) reached no one and told nothing; one that reached a process
// while it was stopped ([Server.Stopped]) reached it when it continued.
//   - every 429 with scope global is avoidable, since a client can keep its
//     credential under the global limit, but for the exception below;
//   - a 429 with scope user from a bucket is, unless the bucket makes a
//     [Claim] or overstates its limit, avoidable when it was sent knowing a response of the same
//     route carrying that bucket's headers to the same credential (for any
//     major parameter), and no live change of the bucket's limit has happened
//     since that response. A request sent before knowing any such response,
//     for example one of several first requests racing for a new bucket, or
//     the first request of a route that shares a busy bucket with routes the
//     client knows, is unavoidable: nothing had told the client which bucket
//     the route uses;
//   - a 429 with scope user from a bucket with a [Claim] is avoidable when it
//     was sent knowing an earlier 429 of the same bucket and major parameter
//     to the same credential: its headers mislead, so the first 429 is
//     unavoidable, but a client must not repeat one it was told about;
//   - a 429 with scope user from a bucket whose headers overstate its limit
//     ([Bucket].Announced above Limit) is avoidable when it was sent knowing
//     an earlier such 429 of the same bucket and major parameter to the same
//     credential and before that 429's retry_after had run out (counted from
//     when the emulator decided it): the headers said there was room, so
//     only a 429 repeated within the wait it named is the client's fault;
//   - a bare 429 ([BareLimit]) is avoidable when it was sent knowing an
//     earlier bare 429 of the same limit and major parameter to the same
//     credential and before the wait that 429's Retry-After named had run
//     out (counted from when the emulator decided it); otherwise, as no
//     header announces the limit, it is unavoidable;
//   - a 429 from the hidden sublimit is avoidable when the rename was sent
//     knowing an earlier sublimit 429 for the same channel to the same
//     credential and before that 429's retry_after had run out (counted from
//     when the emulator decided it); otherwise, as no header announces the
//     sublimit, it is unavoidable;
//   - every 429 with scope shared is unavoidable;
//   - a block response of an [EdgeLimit] is avoidable when the request was
//     sent knowing a block response of the same episode (the same limit and
//     client IP, whatever the token or process), unless the request is a
//     lone probe: sent at least one second (times the time scale) after the
//     latest block response it knew, with no earlier request of that IP
//     into the block still awaiting its response (until a millisecond after
//     the response reached its process, whichever process sent it: the
//     allowance forgives a process for not yet knowing a response, it does
//     not stretch another's request in flight). The first block response of
//     an episode, and requests sent before knowing any block response, are
//     unavoidable. Of two requests in flight into a block at once, the one
//     that reached the emulator second is judged against the first, not the
//     other way round. The rule is the same whatever the body of the block
//     responses, and with [EdgeLimit].Everywhere it judges requests on every
//     route;
//   - a refusal of an [EdgeLimit] without a block is judged by the same
//     rule, the episode being the refusals of the limit to the IP, each
//     less than a second (times the time scale) after the one before
//     reached the client: after a refusal, a client should hold back the
//     IP's requests for a second, then probe.
//
// A request frozen in flight was dated by [SentHeader] before its process
// stopped ([Server.Stopped]) and reached the emulator after it continued,
// later than the SentHeader's usual allowance (Frozen counts them): its
// process let it go under the limits as it knew them, and the freeze, not
// the client, made it late. It is judged by what its process knew when it
// let it go; its own 429 of the global limit or of a bucket (one without a
// Claim and not overstated) is unavoidable, and so is such a 429 of
// another request when its window would have had room without the requests
// frozen in flight it counts. The emulator cannot tell how full the window
// was when such a request was let go, so a request frozen in flight is
// forgiven its own 429 even if its process sent it into a full window;
// Frozen says how many requests a run judged so.
//
// Cloudflare bans are counted in BannedResponses and in ByStatus, not as
// avoidable or unavoidable 429s. Edge blocks are counted in EdgeBlocks, in
// ByStatus and as avoidable or unavoidable 429s, but have no scope; so are
// bare 429s, in Bare.
type Stats struct {
	// Requests is the number of requests answered.
	Requests int
	// ByStatus counts responses by HTTP status.
	ByStatus map[int]int
	// ByScope counts 429s by X-RateLimit-Scope: "user", "global", "shared".
	ByScope map[string]int
	// EdgeBlocks counts the header-less 429s of edge limits ([EdgeLimit]):
	// responses to requests from a blocked IP, or refused over its rate.
	EdgeBlocks int
	// Bare counts the 429s of [BareLimit]s: no rate-limit headers and no
	// body, only Retry-After.
	Bare int
	// Avoidable counts 429s a correct client would not have got.
	Avoidable int
	// Unavoidable counts the other 429s with a scope or of an edge limit.
	Unavoidable int
	// Invalid counts invalid requests: 401, 403, 429 except scope shared, and
	// 404 from a webhook.
	Invalid int
	// Banned reports whether a client IP was banned.
	Banned bool
	// Bans counts the bans that started.
	Bans int
	// BannedResponses counts the Cloudflare 429s sent to banned IPs.
	BannedResponses int
	// Successes counts 2xx responses per bucket hash and major parameter, for
	// routes in the bucket table.
	Successes map[BucketKey]int
	// Lost counts the responses written to no one: their client went away
	// before the way down of the [Network] had passed. What they said told
	// the client nothing.
	Lost int
	// Frozen counts the requests frozen in flight: dated by [SentHeader]
	// before their process stopped ([Server.Stopped]) and written after it
	// continued. They are judged by what their process knew when it handed
	// them to the network, and the 429s of windows they filled are
	// unavoidable; see [Stats].
	Frozen int
	// Log holds the most recent requests, oldest first, up to the limit set
	// by [WithLogLimit].
	Log []LogEntry
	// LogDropped counts older requests no longer in Log.
	LogDropped int
}

// BucketKey names a bucket counter in [Stats]: a bucket hash and a major
// parameter with tokens redacted, such as "channels/123" or
// "webhooks/456/REDACTED".
type BucketKey struct {
	Hash  string
	Major string
}

// LogEntry records one request. It never holds a token: webhook and
// interaction tokens in paths read REDACTED and credentials are identified by
// [Server.CredentialID].
type LogEntry struct {
	// Time is when the emulator decided, on its own clock (without skew):
	// the moment the request arrived, after the way up of the [Network].
	Time time.Time
	// Method is the HTTP method.
	Method string
	// Route is the matched route template, such as
	// "POST /channels/{channel_id}/messages", or for a route outside the
	// table the method and path with tokens redacted.
	Route string
	// Bucket is the bucket hash, "" for a route outside the table.
	Bucket string
	// Major is the major parameter with tokens redacted, "" when none.
	Major string
	// Credential is [Server.CredentialID] of the Authorization header, or
	// "ip:" and the client IP for requests without one.
	Credential string
	// Status is the HTTP status sent.
	Status int
	// Scope is the X-RateLimit-Scope of a 429, "" otherwise.
	Scope string
	// Avoidable marks a 429 that a correct client would not have got; see
	// [Stats].
	Avoidable bool
	// Banned marks a Cloudflare ban response.
	Banned bool
	// Edge marks a block response of an [EdgeLimit].
	Edge bool
	// Renames marks a PATCH /channels/{id} whose body sets name or topic,
	// which counts against the hidden sublimit ([WithHiddenSublimit]).
	Renames bool
	// Bare marks a 429 of a [BareLimit]: no rate-limit headers, no body,
	// only Retry-After.
	Bare bool
	// RetryAfter is the wait a 429 named: its retry_after, or for a bare
	// 429 its Retry-After. It is zero for other responses, edge blocks and
	// bans.
	RetryAfter time.Duration
	// Reached is when the response reached the client: when it was written,
	// after the way down of the [Network]. For a response not written yet
	// when the snapshot was taken it is when it is due, and for a lost one
	// when it would have been.
	Reached time.Time
	// Lost marks a response written to no one: the client went away before
	// the way down had passed.
	Lost bool
	// Frozen marks a request frozen in flight (see Stats.Frozen).
	Frozen bool
}

// statsState accumulates the stats; the server's mutex guards it.
type statsState struct {
	requests        int
	byStatus        map[int]int
	byScope         map[string]int
	edgeBlocks      int
	bare            int
	lost            int
	frozen          int
	avoidable       int
	unavoidable     int
	invalid         int
	bans            int
	bannedResponses int
	successes       map[BucketKey]int
	log             []LogEntry // may hold up to twice the limit; the tail counts
	logged          int        // entries ever appended
}

func (st *statsState) reset() {
	*st = statsState{
		byStatus:  make(map[int]int),
		byScope:   make(map[string]int),
		successes: make(map[BucketKey]int),
	}
}

// record adds one decision to the stats.
func (s *Server) record(q *request, res *result) {
	st := &s.stats
	st.requests++
	st.byStatus[res.status]++
	if q.frozen {
		st.frozen++
	}
	switch {
	case res.banned:
		st.bannedResponses++
	case res.edge:
		st.edgeBlocks++
		if res.avoidable {
			st.avoidable++
		} else {
			st.unavoidable++
		}
	case res.bare:
		st.bare++
		if res.avoidable {
			st.avoidable++
		} else {
			st.unavoidable++
		}
	case res.status == http.StatusTooManyRequests:
		st.byScope[res.scope]++
		if res.avoidable {
			st.avoidable++
		} else {
			st.unavoidable++
		}
	case res.status < 300 && res.hash != "":
		st.successes[BucketKey{Hash: res.hash, Major: q.majorSafe}]++
	}
	res.entry = -1
	limit := s.cfg.logLimit
	if limit <= 0 {
		return
	}
	res.entry = s.logSeq
	s.logSeq++
	st.logged++
	st.log = append(st.log, LogEntry{
		Time:       res.decided,
		Method:     q.method,
		Route:      res.route,
		Bucket:     res.hash,
		Major:      q.majorSafe,
		Credential: s.credentialID(q),
		Status:     res.status,
		Scope:      res.scope,
		Avoidable:  res.avoidable,
		Banned:     res.banned,
		Edge:       res.edge,
		Renames:    q.renames,
		Bare:       res.bare,
		RetryAfter: res.named(),
		Reached:    res.reached,
		Frozen:     q.frozen,
	})
	if len(st.log) >= 2*limit {
		st.log = append([]LogEntry(nil), st.log[len(st.log)-limit:]...)
	}
}

// markLog applies f to the log entry numbered entry (counting every entry
// ever appended, across [Server.ResetStats]), if the log still holds it.
func (s *Server) markLog(entry int, f func(*LogEntry)) {
	st := &s.stats
	if entry < 0 {
		return
	}
	if i := entry - (s.logSeq - len(st.log)); i >= 0 && i < len(st.log) {
		f(&st.log[i])
	}
}

// Stats returns a snapshot of the stats. It is safe to call while requests
// are being served.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.stats
	log := st.log
	if n := s.cfg.logLimit; len(log) > n {
		log = log[len(log)-n:]
	}
	return Stats{
		Requests:        st.requests,
		ByStatus:        maps.Clone(st.byStatus),
		ByScope:         maps.Clone(st.byScope),
		EdgeBlocks:      st.edgeBlocks,
		Bare:            st.bare,
		Lost:            st.lost,
		Frozen:          st.frozen,
		Avoidable:       st.avoidable,
		Unavoidable:     st.unavoidable,
		Invalid:         st.invalid,
		Banned:          st.bans > 0,
		Bans:            st.bans,
		BannedResponses: st.bannedResponses,
		Successes:       maps.Clone(st.successes),
		Log:             append([]LogEntry(nil), log...),
		LogDropped:      st.logged - len(log),
	}
}

// ResetStats clears the stats and the log, for example between the phases of
// a benchmark. Counters and bans are kept; see [Server.ResetLimits].
func (s *Server) ResetStats() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.reset()
}
