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
// got it:
//   - every 429 with scope global is avoidable, since a client can keep its
//     credential under the global limit;
//   - a 429 with scope user from a bucket is avoidable when a response of
//     the same route carrying that bucket's headers had reached the same
//     credential (for any major parameter) by the time the client sent the
//     request, and no live change of the bucket's limit has happened since.
//     A response reaches the client when the way down of the [Network] has
//     passed. A
//     request sent before any such response arrived, for example one of
//     several first requests racing for a new bucket, or the first request
//     of a route that shares a busy bucket with routes the client knows, is
//     unavoidable: nothing had told the client which bucket the route uses;
//   - a 429 from the hidden sublimit and every 429 with scope shared are
//     unavoidable, because no header announced them.
//
// Cloudflare bans are counted in BannedResponses and in ByStatus, not as
// avoidable or unavoidable 429s.
type Stats struct {
	// Requests is the number of requests answered.
	Requests int
	// ByStatus counts responses by HTTP status.
	ByStatus map[int]int
	// ByScope counts 429s by X-RateLimit-Scope: "user", "global", "shared".
	ByScope map[string]int
	// Avoidable counts 429s a correct client would not have got.
	Avoidable int
	// Unavoidable counts the other 429s with a scope.
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
}

// statsState accumulates the stats; the server's mutex guards it.
type statsState struct {
	requests        int
	byStatus        map[int]int
	byScope         map[string]int
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
	switch {
	case res.banned:
		st.bannedResponses++
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
	limit := s.cfg.logLimit
	if limit <= 0 {
		return
	}
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
	})
	if len(st.log) >= 2*limit {
		st.log = append([]LogEntry(nil), st.log[len(st.log)-limit:]...)
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
