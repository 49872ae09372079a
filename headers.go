package ratecord

import (
	"bytes"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratecord/ratecord/store"
)

// limits is what one response says about the rate limits. Every field is
// validated: a value that is missing, malformed, negative, NaN or absurd is
// dropped or replaced by the conservative choice, never trusted.
type limits struct {
	bucket     string
	hasLimit   bool
	limit      int
	remaining  int
	resetAfter time.Duration // negative: unknown
	reset      time.Time     // X-RateLimit-Reset on Discord's clock; zero: unknown

	// For 429 responses only.
	scope      store.Scope
	ban        bool // a block of the whole IP: a ban page, or a body that is not JSON
	retryAfter time.Duration
	hasRetry   bool // retryAfter came from the response
}

// Header names, canonical so lookups need no conversion.
const (
	hdrLimit      = "X-Ratelimit-Limit"
	hdrRemaining  = "X-Ratelimit-Remaining"
	hdrResetAfter = "X-Ratelimit-Reset-After"
	hdrReset      = "X-Ratelimit-Reset"
	hdrBucket     = "X-Ratelimit-Bucket"
	hdrGlobal     = "X-Ratelimit-Global"
	hdrScope      = "X-Ratelimit-Scope"
	hdrRetryAfter = "Retry-After"
)

const (
	// maxLimit bounds a believable X-RateLimit-Limit.
	maxLimit = 1 << 20
	// maxBucketLen bounds a believable bucket hash.
	maxBucketLen = 64
	// maxSeconds bounds any duration read from a response.
	maxSeconds = 24 * 60 * 60
)

// parseHeaders reads the bucket headers of a response.
func parseHeaders(h http.Header) limits {
	var l limits
	l.bucket = parseBucket(first(h, hdrBucket))
	l.resetAfter = -1
	limit, okLimit := parseCount(first(h, hdrLimit))
	remaining, okRemaining := parseCount(first(h, hdrRemaining))
	if okLimit && limit > 0 {
		l.hasLimit = true
		l.limit = limit
		// A malformed Remaining next to a valid Limit means none left.
		if okRemaining {
			l.remaining = min(remaining, limit)
		}
		if d, ok := parseSeconds(first(h, hdrResetAfter), false); ok {
			l.resetAfter = d
		}
		l.reset = parseEpoch(first(h, hdrReset))
	}
	return l
}

// parse429 classifies a 429 response from its headers and body (the body
// may be empty or not JSON). legacy selects millisecond units for
// Retry-After and retry_after (API versions before 8).
func parse429(h http.Header, body []byte, legacy bool) limits {
	l := parseHeaders(h)
	var b struct {
		RetryAfter *float64 `json:"retry_after"`
		Global     *bool    `json:"global"`
		Code       *int     `json:"code"`
		Message    string   `json:"message"`
	}
	bodyRetry, bodyOK := time.Duration(0), false
	isJSON := json.Unmarshal(body, &b) == nil
	if isJSON && b.RetryAfter != nil {
		bodyRetry, bodyOK = secondsToDuration(*b.RetryAfter, legacy)
	}
	headerRetry, headerOK := parseSeconds(first(h, hdrRetryAfter), legacy)

	announced := l.bucket != "" || l.hasLimit || first(h, hdrScope) != "" || first(h, hdrGlobal) != ""
	if !announced && !bodyOK {
		// No rate-limit headers and no retry_after. Discord's API answers
		// JSON: a body that is not JSON (a Cloudflare ban page, an HTML or
		// text error) comes from in front of it and covers the whole IP
		// address, on every route. (Cloudflare's own responses also lack
		// Discord's Via header, but proxies strip it, so it decides
		// nothing.)
		l.scope = store.ScopeBlocked
		l.retryAfter, l.hasRetry = headerRetry, headerOK
		trimmed := bytes.TrimSpace(body)
		if len(trimmed) > 0 && !json.Valid(trimmed) || banPage(body, isJSON && b.Code != nil && *b.Code == 0, b.Message) {
			l.ban = true
			return l
		}
		if headerOK {
			// A wait named by Retry-After alone (an empty or JSON body, as
			// Discord's API sends on some routes): wait exactly that long,
			// on the request's bucket, as for a 429 of scope user.
			l.scope = store.ScopeUser
			return l
		}
		// Limited without saying for how long or on what: a block of the
		// route, which backs off (see store.ScopeBlocked).
		return l
	}
	switch {
	case bodyOK:
		l.retryAfter, l.hasRetry = bodyRetry, true
	case headerOK:
		l.retryAfter, l.hasRetry = headerRetry, true
	case l.resetAfter >= 0:
		l.retryAfter, l.hasRetry = l.resetAfter, true
	}
	switch strings.ToLower(strings.TrimSpace(first(h, hdrScope))) {
	case "global":
		l.scope = store.ScopeGlobal
	case "shared":
		l.scope = store.ScopeShared
	default:
		// "user", and scopes this version does not know: the bucket.
		l.scope = store.ScopeUser
	}
	if strings.EqualFold(strings.TrimSpace(first(h, hdrGlobal)), "true") || b.Global != nil && *b.Global {
		l.scope = store.ScopeGlobal
	}
	if !l.hasRetry {
		// Limited without saying for how long: back off as from a block.
		l.scope = store.ScopeBlocked
	}
	return l
}

// banPage reports whether a 429 body is one of Cloudflare's ban pages: an
// HTML page, the plain text "error code: 1015", or the static JSON with
// code 0 (zeroJSON) whose message says the client is blocked. They say the IP is banned, not one route.
func banPage(body []byte, zeroJSON bool, message string) bool {
	if zeroJSON {
		return strings.Contains(strings.ToLower(message), "blocked")
	}
	b := bytes.TrimSpace(body)
	if len(b) > 0 && b[0] == '<' {
		return true
	}
	return bytes.Contains(b, []byte("error code: 1015")) || bytes.Contains(b, []byte("Error 1015"))
}

// first returns the first value of a canonical header key without
// allocating.
func first(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// parseCount parses a non-negative integer count.
func parseCount(s string) (int, bool) {
	if n, ok := parseDigits(s); ok {
		return n, n <= maxLimit
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		// Tolerate "5.0", never "5.5".
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || f < 0 || f > maxLimit {
			return 0, false
		}
		n = int(f)
	}
	if n < 0 || n > maxLimit {
		return 0, false
	}
	return n, true
}

// parseSeconds parses a duration in seconds (milliseconds when ms is set),
// clamped to a day.
func parseSeconds(s string, ms bool) (time.Duration, bool) {
	if d, ok := parseMillis(s, ms); ok {
		return d, true
	}
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, false
	}
	return secondsToDuration(f, ms)
}

// maxEpoch bounds a believable X-RateLimit-Reset, in seconds since the
// Unix epoch (the year 5138).
const maxEpoch = 1e11

// parseEpoch reads X-RateLimit-Reset, seconds since the Unix epoch with a
// fraction ("1470173023.123"), to the millisecond. Anything else gives the
// zero time: the value is only compared with other responses' (see
// store.Update.Reset), so a missing one costs nothing but a sharper view.
func parseEpoch(s string) time.Time {
	if s = strings.TrimSpace(s); s == "" {
		return time.Time{} // without a call that would allocate its error
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f <= 0 || f >= maxEpoch {
		return time.Time{}
	}
	return time.UnixMilli(int64(math.Round(f * 1000)))
}

func secondsToDuration(f float64, ms bool) (time.Duration, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
		return 0, false
	}
	if ms {
		f /= 1000
	}
	if f > maxSeconds {
		f = maxSeconds
	}
	// Round up to the millisecond so a truncated value never shortens a wait.
	return time.Duration(math.Ceil(f*1000-1e-6)) * time.Millisecond, true
}

// parseBucket accepts an opaque bucket hash of printable ASCII.
func parseBucket(s string) string {
	if s == "" || len(s) > maxBucketLen {
		return ""
	}
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' {
			return ""
		}
	}
	return s
}

// parseMillis is the fast path of parseSeconds for the plain decimals
// Discord sends ("64.570", "1"): up to 9 integer digits, rounded up to the
// millisecond. Anything else is left to strconv.
func parseMillis(s string, ms bool) (time.Duration, bool) {
	if s == "" || len(s) > 20 {
		return 0, false
	}
	var whole, frac int64
	i := 0
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		whole = whole*10 + int64(s[i]-'0')
	}
	if i == 0 || i > 9 {
		return 0, false
	}
	digits := 0
	roundUp := false
	if i < len(s) {
		if s[i] != '.' || ms {
			return 0, false
		}
		for i++; i < len(s); i++ {
			c := s[i]
			if c < '0' || c > '9' {
				return 0, false
			}
			if digits < 3 {
				frac = frac*10 + int64(c-'0')
				digits++
			} else if c != '0' {
				roundUp = true
			}
		}
	}
	for ; digits < 3; digits++ {
		frac *= 10
	}
	if roundUp {
		frac++
	}
	if ms {
		return min(time.Duration(whole)*time.Millisecond, maxSeconds*time.Second), true
	}
	return min(time.Duration(whole)*time.Second+time.Duration(frac)*time.Millisecond, maxSeconds*time.Second), true
}

// parseDigits parses a plain decimal integer of up to 9 digits.
func parseDigits(s string) (int, bool) {
	if s == "" || len(s) > 9 {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n, true
}
