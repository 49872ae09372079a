package model

// Cred holds the deadlines that concern every request of one credential.
// Times are in milliseconds.
type Cred struct {
	// Pause holds every request that counts against the global limit (a
	// global 429).
	Pause int64
	// Unauthorized refuses the credential's requests (a 401).
	Unauthorized int64
}

// The scopes of 429 responses and refusals, as the stores name them.
const (
	ScopeUser    = "user"
	ScopeGlobal  = "global"
	ScopeShared  = "shared"
	ScopeBlocked = "blocked"
)

// Limited applies a 429 of the scopes wider than a bucket, global and
// blocked, received at now, with retry (offset included), and reports
// whether the scope was one of them. A block changes nothing here: the
// store's edge gates hold it, for every credential.
func (c *Cred) Limited(now int64, scope string, retry int64) bool {
	switch scope {
	case ScopeGlobal:
		c.Pause = max(c.Pause, now+clamp(retry))
	case ScopeBlocked:
		// A Cloudflare block is per IP address, not per credential: the
		// store's edge gates hold it (store/internal/edge).
	default:
		return false
	}
	return true
}

// Invalid reports whether a response counts against Discord's
// invalid-request limit: 401, 403 and 429 other than scope shared.
func Invalid(status int64, scope string) bool {
	return status == 401 || status == 403 || status == 429 && scope != ScopeShared
}

// Uncounted reports whether a response shows that its bucket did not count
// its request: a 429 of scope shared limits one resource for everyone, not
// the route, and Discord answers it with the bucket's headers as they were
// (their Remaining can be above 0). Its slot goes back; the headers, which
// only ever lower the count, then say what the bucket did count. A shared
// 429 without headers keeps its slot.
func Uncounted(status int64, scope string, hasLimit bool) bool {
	return status == 429 && scope == ScopeShared && hasLimit
}

// Cooldowns say what a response puts on cooldown.
const (
	CooldownNone       = 0
	CooldownCredential = 1 // the credential answered 401
	CooldownMajor      = 2 // a token-authenticated major (webhook) answered 401 or 404
)

// CooldownOf returns what a response with status puts on cooldown.
// tokenAuth reports that the route authenticates with a token in its path;
// anonymous that the request carried no credential at all: its 401 says
// nothing of the next request without one (GET /gateway needs none).
func CooldownOf(status int64, tokenAuth, anonymous bool) int {
	switch {
	case tokenAuth && (status == 401 || status == 404):
		return CooldownMajor
	case !tokenAuth && !anonymous && status == 401:
		return CooldownCredential
	}
	return CooldownNone
}

// What a response teaches about a route's bucket.
const (
	RouteSame    = 0 // nothing new
	RouteLearned = 1 // the route uses the named bucket hash
	RouteNone    = 2 // the route answers without rate-limit headers
)

// LearnRoute returns what a response teaches a route that maps to hash
// (none: it is known to have no bucket): the response named bucket, or
// answered status with or without limits.
func LearnRoute(hash string, none bool, bucket string, status int64, hasLimit bool) int {
	switch {
	case bucket != "":
		if hash != bucket || none {
			return RouteLearned
		}
	case status >= 200 && status < 300 && !hasLimit && hash == "" && !none:
		return RouteNone
	}
	return RouteSame
}

// Invalid-request counting: Discord counts over ten minutes; the stores
// count in slots of ten seconds, a sliding window that errs on the side of
// counting too much (up to one slot longer).
const (
	InvalidSlot  = 10_000 // ms
	InvalidSlots = 60
)

// InvalidCounts reports whether a slot index still counts at slot cur.
func InvalidCounts(cur, idx int64) bool { return cur-idx <= InvalidSlots }

// InvalidFree returns when the oldest counted slot, oldest, stops counting.
func InvalidFree(oldest int64) int64 { return (oldest + InvalidSlots + 1) * InvalidSlot }

// SublimitMargin is how much longer than its bucket's reset (offset
// included) a 429's retry must be, in milliseconds, to be taken as a
// hidden sublimit's rather than the bucket's own: Discord's retry_after
// and Reset-After of one bucket differ by less.
const SublimitMargin = 1000

// HiddenSublimit reports whether a 429 of scope user with retry (offset
// included), on a request of a kind that can hit a hidden sublimit (a
// channel rename), came from that sublimit: the same response says its
// bucket still had room (remaining above zero), or its retry outlasts the
// reset the response gave its bucket (resetAfter, negative when unknown)
// by more than SublimitMargin. Such a 429 holds only the requests of its
// kind; the bucket follows its headers.
func HiddenSublimit(retry, resetAfter, offset, remaining int64) bool {
	return remaining > 0 || resetAfter >= 0 && clamp(retry) > clamp(resetAfter)+clamp(offset)+SublimitMargin
}
