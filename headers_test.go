package ratecord

import (
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestParseHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		h    http.Header
		want limits
	}{
		{"complete", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "64.570", "X-RateLimit-Bucket", "abcd1234"),
			limits{bucket: "abcd1234", hasLimit: true, limit: 5, remaining: 4, resetAfter: 64570 * time.Millisecond}},
		{"none", hdr(), limits{resetAfter: -1}},
		{"sub-millisecond rounds up", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "0.2501"),
			limits{hasLimit: true, limit: 5, remaining: 0, resetAfter: 251 * time.Millisecond}},
		{"malformed remaining means none left", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "lots", "X-RateLimit-Reset-After", "1"),
			limits{hasLimit: true, limit: 5, remaining: 0, resetAfter: time.Second}},
		{"negative remaining means none left", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "-3", "X-RateLimit-Reset-After", "1"),
			limits{hasLimit: true, limit: 5, remaining: 0, resetAfter: time.Second}},
		{"remaining above limit is capped", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "50", "X-RateLimit-Reset-After", "1"),
			limits{hasLimit: true, limit: 5, remaining: 5, resetAfter: time.Second}},
		{"missing reset-after is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "1"),
			limits{hasLimit: true, limit: 5, remaining: 1, resetAfter: -1}},
		{"NaN reset-after is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset-After", "NaN"),
			limits{hasLimit: true, limit: 5, remaining: 1, resetAfter: -1}},
		{"infinite reset-after is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset-After", "+Inf"),
			limits{hasLimit: true, limit: 5, remaining: 1, resetAfter: -1}},
		{"negative reset-after is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset-After", "-2"),
			limits{hasLimit: true, limit: 5, remaining: 1, resetAfter: -1}},
		{"huge reset-after is clamped to a day", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1e300"),
			limits{hasLimit: true, limit: 5, remaining: 0, resetAfter: 24 * time.Hour}},
		{"zero limit is no limit", hdr("X-RateLimit-Limit", "0", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1"),
			limits{resetAfter: -1}},
		{"huge limit is ignored", hdr("X-RateLimit-Limit", "99999999999", "X-RateLimit-Remaining", "9", "X-RateLimit-Reset-After", "1"),
			limits{resetAfter: -1}},
		{"fractional limit is ignored", hdr("X-RateLimit-Limit", "5.5", "X-RateLimit-Remaining", "1", "X-RateLimit-Reset-After", "1"),
			limits{resetAfter: -1}},
		{"reset read to the millisecond", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "1", "X-RateLimit-Reset", "1470173023.123"),
			limits{hasLimit: true, limit: 5, remaining: 4, resetAfter: time.Second, reset: time.UnixMilli(1470173023123)}},
		{"malformed reset is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "1", "X-RateLimit-Reset", "soon"),
			limits{hasLimit: true, limit: 5, remaining: 4, resetAfter: time.Second}},
		{"NaN reset is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "1", "X-RateLimit-Reset", "NaN"),
			limits{hasLimit: true, limit: 5, remaining: 4, resetAfter: time.Second}},
		{"negative reset is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "1", "X-RateLimit-Reset", "-1470173023"),
			limits{hasLimit: true, limit: 5, remaining: 4, resetAfter: time.Second}},
		{"absurd reset is unknown", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "4", "X-RateLimit-Reset-After", "1", "X-RateLimit-Reset", "1e300"),
			limits{hasLimit: true, limit: 5, remaining: 4, resetAfter: time.Second}},
		{"bucket with spaces is ignored", hdr("X-RateLimit-Bucket", "a b"), limits{resetAfter: -1}},
		{"overlong bucket is ignored", hdr("X-RateLimit-Bucket", strings.Repeat("a", 65)), limits{resetAfter: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parseHeaders(tt.h); got != tt.want {
				t.Errorf("parseHeaders(%v) = %+v; want %+v", tt.h, got, tt.want)
			}
		})
	}
}

func TestParse429(t *testing.T) {
	t.Parallel()
	bucketHdr := []string{"X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "2.5", "X-RateLimit-Bucket", "b"}
	with := func(kv ...string) http.Header { return hdr(append(append([]string{}, bucketHdr...), kv...)...) }
	tests := []struct {
		name      string
		h         http.Header
		body      string
		legacy    bool
		scope     store.Scope
		retry     time.Duration
		hasRetry  bool
		wantLimit bool
	}{
		{"user, body is more precise than header", with("Retry-After", "2", "X-RateLimit-Scope", "user"),
			`{"message":"You are being rate limited.","retry_after":1.234,"global":false}`, false, store.ScopeUser, 1234 * time.Millisecond, true, true},
		{"global by header", hdr("Retry-After", "1", "X-RateLimit-Global", "true", "X-RateLimit-Scope", "global"),
			`{"retry_after":0.5,"global":true}`, false, store.ScopeGlobal, 500 * time.Millisecond, true, false},
		{"global by body flag only", hdr("Retry-After", "1"), `{"retry_after":0.5,"global":true}`, false, store.ScopeGlobal, 500 * time.Millisecond, true, false},
		{"shared", with("Retry-After", "30", "X-RateLimit-Scope", "shared"), `{"retry_after":29.5}`, false, store.ScopeShared, 29500 * time.Millisecond, true, true},
		{"unknown scope is the bucket", with("X-RateLimit-Scope", "galactic"), `{"retry_after":1}`, false, store.ScopeUser, time.Second, true, true},
		{"header when the body is not JSON", with("Retry-After", "3"), `<html>oops</html>`, false, store.ScopeUser, 3 * time.Second, true, true},
		{"reset-after when nothing else", with(), ``, false, store.ScopeUser, 2500 * time.Millisecond, true, true},
		{"negative retry_after falls back to the header", with("Retry-After", "4"), `{"retry_after":-1}`, false, store.ScopeUser, 4 * time.Second, true, true},
		{"absurd retry_after is clamped", with(), `{"retry_after":1e308}`, false, store.ScopeUser, 24 * time.Hour, true, true},
		{"legacy milliseconds", with("Retry-After", "1500"), `{"retry_after":1500}`, true, store.ScopeUser, 1500 * time.Millisecond, true, true},
		{"cloudflare html", hdr("Content-Type", "text/html"), `<html><body>error code: 1015</body></html>`, false, store.ScopeBlocked, 0, false, false},
		{"cloudflare json without retry_after", hdr(), `{"code":0,"message":"You are being blocked from accessing our API temporarily due to exceeding our rate limits frequently."}`, false, store.ScopeBlocked, 0, false, false},
		{"cloudflare with Retry-After", hdr("Retry-After", "60"), `error code: 1015`, false, store.ScopeBlocked, time.Minute, true, false},
		{"scope header without any duration backs off", hdr("X-RateLimit-Scope", "user"), ``, false, store.ScopeBlocked, 0, false, false},
		{"NaN Retry-After", hdr("Retry-After", "NaN"), `{}`, false, store.ScopeBlocked, 0, false, false},
		{"header-less Retry-After is a wait on the bucket", hdr("Retry-After", "1", "Via", "1.1 google"), ``, false, store.ScopeUser, time.Second, true, false},
		{"header-less Retry-After with a JSON body", hdr("Retry-After", "2"), `{"message":"You are being rate limited."}`, false, store.ScopeUser, 2 * time.Second, true, false},
		{"header-less Retry-After with a text body is a block", hdr("Retry-After", "2"), `Too Many Requests`, false, store.ScopeBlocked, 2 * time.Second, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parse429(tt.h, []byte(tt.body), tt.legacy)
			if got.scope != tt.scope || got.retryAfter != tt.retry || got.hasRetry != tt.hasRetry || got.hasLimit != tt.wantLimit {
				t.Errorf("parse429(%v, %q) = %+v; want scope %q retry %v (set %v), limit %v", tt.h, tt.body, got, tt.scope, tt.retry, tt.hasRetry, tt.wantLimit)
			}
		})
	}
}

func FuzzParse429(f *testing.F) {
	f.Add("5", "0", "1.5", "bucket", "user", "2", `{"retry_after":1.5}`, false)
	f.Add("", "", "", "", "", "", `<html>`, false)
	f.Add("1e9", "-1", "NaN", "x y", "global", "Inf", `{"retry_after":"x"}`, true)
	f.Fuzz(func(t *testing.T, limit, remaining, resetAfter, bucket, scope, retryAfter, body string, legacy bool) {
		h := hdr("X-RateLimit-Limit", limit, "X-RateLimit-Remaining", remaining, "X-RateLimit-Reset-After", resetAfter,
			"X-RateLimit-Bucket", bucket, "X-RateLimit-Scope", scope, "Retry-After", retryAfter)
		for _, l := range []limits{parseHeaders(h), parse429(h, []byte(body), legacy)} {
			if l.hasLimit && (l.limit <= 0 || l.remaining < 0 || l.remaining > l.limit) {
				t.Fatalf("invalid counts accepted: %+v", l)
			}
			if l.resetAfter > 24*time.Hour || l.retryAfter < 0 || l.retryAfter > 24*time.Hour {
				t.Fatalf("duration out of range: %+v", l)
			}
			if l.resetAfter < 0 && l.resetAfter != -1 {
				t.Fatalf("negative reset other than unknown: %+v", l)
			}
			if len(l.bucket) > maxBucketLen {
				t.Fatalf("overlong bucket: %+v", l)
			}
		}
		// A 429 is never read as "no wait": it either has a duration from
		// the response or is a block that backs off.
		l := parse429(h, []byte(body), legacy)
		if l.scope == "" || (!l.hasRetry && l.scope != store.ScopeBlocked) {
			t.Fatalf("429 without a wait or a block: %+v", l)
		}
	})
}

func TestSecondsToDuration(t *testing.T) {
	t.Parallel()
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -0.001} {
		if d, ok := secondsToDuration(f, false); ok {
			t.Errorf("secondsToDuration(%v) = %v, true; want rejected", f, d)
		}
	}
	if d, _ := secondsToDuration(0.123, false); d != 123*time.Millisecond {
		t.Errorf("secondsToDuration(0.123) = %v; want 123ms", d)
	}
}

// TestParse429Ban: Cloudflare's ban pages, and any header-less 429 whose
// body is not JSON (Discord's API answers JSON), block the IP on every
// route; a bare header-less 429 only its route.
func TestParse429Ban(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		h    http.Header
		body string
		ban  bool
	}{
		{"html page", hdr("Content-Type", "text/html"), "\n <!DOCTYPE html><html><title>Access denied</title></html>", true},
		{"plain 1015", hdr(), "error code: 1015", true},
		{"static json", hdr(), `{"code": 0, "message": "You are being blocked from accessing our API temporarily due to exceeding our rate limits frequently."}`, true},
		{"empty body", hdr(), "", false},
		{"json without a code", hdr(), `{}`, false},
		{"scope header only", hdr("X-RateLimit-Scope", "user"), ``, false},
		{"text body", hdr("Content-Type", "text/plain"), "Too Many Requests", true},
		{"html error page", hdr("Content-Type", "text/html"), "Slow down", true},
		{"text body with Retry-After", hdr("Retry-After", "1"), "rate limited", true},
		{"malformed JSON from the API is still JSON", hdr(), `{"retry_after":"soon"}`, false},
		{"empty body with Retry-After", hdr("Retry-After", "1"), "", false},
		{"html with rate-limit headers is Discord's", hdr("X-RateLimit-Limit", "5", "X-RateLimit-Remaining", "0", "X-RateLimit-Reset-After", "1"), `<html>oops</html>`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := parse429(tt.h, []byte(tt.body), false); got.ban != tt.ban {
				t.Errorf("parse429(%v, %q).ban = %v; want %v", tt.h, tt.body, got.ban, tt.ban)
			}
		})
	}
}
