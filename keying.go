package ratecord

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"hash/maphash"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord/store"
)

// routeKey is what keying learns from a request: which counter it belongs to
// and which limits apply. It never holds a token.
type routeKey struct {
	credential string // keyed hash of the Authorization header, or store.Unauthenticated
	route      string // method and route template: "POST /channels/:id/messages"
	major      string // "channels/123", "webhooks/1/<token hash>", "" for none
	global     bool   // counts against the credential's global limit
	tokenAuth  bool   // a webhook or interaction token in the path authenticates it
	legacy     bool   // API before v8: 429 durations are milliseconds
	dated      bool   // the route depended on the time (old-message delete)
}

// oldMessageSuffix marks the route of deleting a message older than 14 days,
// which Discord limits in a bucket of its own. A '#' cannot occur in a path.
const oldMessageSuffix = "#old"

// discordEpoch is the first millisecond of 2015, where snowflakes start.
const discordEpoch = 1420070400000

// interactionTokenPrefix starts every interaction token: it is the base64
// encoding of "interaction:".
const interactionTokenPrefix = "aW50ZXJhY3Rpb246"

// keyer turns requests into route keys. It is safe for concurrent use.
type keyer struct {
	secret []byte
	pool   sync.Pool // of hash.Hash keyed with secret
	last   atomic.Pointer[credEntry]
	tmpl   templates
	seed   maphash.Seed
	paths  [pathCacheSize]atomic.Pointer[pathEntry]
	seeds  [2]maphash.Seed // of secret digests

	mu    sync.RWMutex // guards cache
	cache map[secretDigest]string
}

// secretDigest stands for a secret (an Authorization value, a webhook
// token) in the keyer's caches, which never keep the secret itself: 128
// bits of hashes under seeds drawn for this keyer. It has a fixed size
// however long the secret, and two secrets share one only by a chance of
// about 2^-128.
type secretDigest [2]uint64

func (k *keyer) digest(secret string) secretDigest {
	return secretDigest{maphash.String(k.seeds[0], secret), maphash.String(k.seeds[1], secret)}
}

// credEntry is the last credential keyed.
type credEntry struct {
	digest secretDigest
	id     string
}

// pathEntry is a keyed path in the keyer's path cache: a bot sends to the
// same channels over and over, so most requests are keyed by one lookup.
type pathEntry struct {
	method, path string
	rk           routeKey
}

// pathCacheSize is the number of slots of the direct-mapped path cache.
const pathCacheSize = 1024

// maxCachedSecrets bounds the cache of secret -> hash.
const maxCachedSecrets = 4096

func newKeyer(secret []byte) *keyer {
	k := &keyer{
		secret: secret,
		cache:  make(map[secretDigest]string),
		seed:   maphash.MakeSeed(),
		seeds:  [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()},
	}
	k.pool.New = func() any { return hmac.New(sha256.New, k.secret) }
	return k
}

// key computes the route key of req; now tells the time, read only when
// the route depends on it.
func (k *keyer) key(req *http.Request, now func() time.Time) routeKey {
	method := req.Method
	if method == "" {
		method = http.MethodGet
	}
	rk := k.route(method, req.URL.Path, now)
	if rk.major != "" && rk.tokenAuth && rk.major[0] == 'w' {
		// webhooks/{id}/{token}: the token is part of the major parameter,
		// but only as a hash.
		id, token := splitToken(rk.major)
		rk.major = id + "/" + k.hashSecret(token, !isInteractionToken(token))
	}
	if auth := first(req.Header, "Authorization"); auth != "" {
		rk.credential = k.credential(auth)
	} else {
		rk.credential = store.Unauthenticated
	}
	return rk
}

// route keys method (not empty) and path, from the path cache when it can. Paths with
// tokens are never cached (each is new, and holds a secret), nor paths with
// a segment templated as a token (a long one, which may be a secret), nor
// paths longer than maxCachedPath, nor routes that depend on the time.
func (k *keyer) route(method, path string, now func() time.Time) routeKey {
	slot := &k.paths[(maphash.String(k.seed, path)+uint64(len(method))<<8+uint64(method[0]))%pathCacheSize]
	if e := slot.Load(); e != nil && e.path == path && e.method == method {
		return e.rk
	}
	rk := parseRoute(method, path, now, &k.tmpl)
	if !rk.tokenAuth && !rk.dated && len(path) <= maxCachedPath && !strings.Contains(rk.route, ":token") {
		slot.Store(&pathEntry{method: method, path: path, rk: rk})
	}
	return rk
}

// maxCachedPath is the longest path the path cache keeps, so that it holds
// at most pathCacheSize × maxCachedPath bytes of paths.
const maxCachedPath = 256

// credential returns the keyed hash of an Authorization header value.
func (k *keyer) credential(auth string) string {
	d := k.digest(auth)
	if e := k.last.Load(); e != nil && e.digest == d {
		return e.id
	}
	id := k.hashDigested(auth, d)
	k.last.Store(&credEntry{digest: d, id: id})
	return id
}

// hashSecret returns a keyed hash of secret, remembering it by its digest
// when cache is set. The hash cannot be turned back into the secret.
func (k *keyer) hashSecret(secret string, cache bool) string {
	if !cache {
		return k.hash(secret)
	}
	return k.hashDigested(secret, k.digest(secret))
}

// hashDigested returns the keyed hash of secret, whose digest is d, from
// the cache when it is there. The cache keeps digests and hashes only, and
// is emptied when it reaches maxCachedSecrets entries.
func (k *keyer) hashDigested(secret string, d secretDigest) string {
	k.mu.RLock()
	id, ok := k.cache[d]
	k.mu.RUnlock()
	if ok {
		return id
	}
	id = k.hash(secret)
	k.mu.Lock()
	if len(k.cache) >= maxCachedSecrets {
		clear(k.cache)
	}
	k.cache[d] = id
	k.mu.Unlock()
	return id
}

// hash returns the keyed hash (HMAC-SHA256, 16 bytes in base64) of secret.
func (k *keyer) hash(secret string) string {
	h := k.pool.Get().(hash.Hash)
	h.Reset()
	h.Write([]byte(secret))
	var sum [sha256.Size]byte
	id := base64.RawURLEncoding.EncodeToString(h.Sum(sum[:0])[:16])
	k.pool.Put(h)
	return id
}

// splitToken splits "webhooks/{id}/{token}" into "webhooks/{id}" and the token.
func splitToken(major string) (string, string) {
	for i := len("webhooks/"); i < len(major); i++ {
		if major[i] == '/' {
			return major[:i], major[i+1:]
		}
	}
	return major, ""
}

func isInteractionToken(tok string) bool {
	return len(tok) >= len(interactionTokenPrefix) && tok[:len(interactionTokenPrefix)] == interactionTokenPrefix
}

// parseRoute keys a request by method and path alone. It is a pure
// function but for tmpl, which only interns the route's descriptor (nil
// makes a new one). For webhooks the major parameter it returns still holds
// the raw token, which the keyer replaces by its hash.
func parseRoute(method, path string, now func() time.Time, tmpl *templates) routeKey {
	rk := routeKey{global: true}
	w := newSegments(path)
	rk.legacy = w.legacy

	var arr [128]byte
	buf := append(arr[:0], method...)
	buf = append(buf, ' ')

	var (
		firstStart int    // where the first segment starts in path
		msgID      string // for the old-message check
		n          int    // segments read
	)
	for {
		seg, ok := w.next()
		if !ok {
			break
		}
		if seg.n == 0 {
			firstStart = seg.start
		}
		n = seg.n + 1
		switch seg.kind {
		case segInReaction:
			continue // part of the reaction
		case segMajor:
			buf = append(buf, "/:id"...)
			rk.major = path[firstStart:seg.end]
		case segLong:
			buf = append(buf, "/:token"...)
		case segToken:
			buf = append(buf, "/:token"...)
			if w.major {
				rk.tokenAuth = true
				if w.first == "webhooks" {
					rk.major = path[firstStart:seg.end]
					if isInteractionToken(seg.text) {
						rk.global = false
					}
				} else {
					// An interaction id names exactly one token, so the id
					// alone is the major parameter and no hash is needed.
					rk.global = false
				}
			}
		case segReaction:
			buf = append(buf, "/:reaction"...)
		case segID:
			buf = append(buf, "/:id"...)
			if seg.n == 3 && seg.prev == "messages" && w.first == "channels" {
				msgID = seg.text
			}
		case segCode:
			buf = append(buf, "/:code"...)
		default:
			buf = append(buf, '/')
			buf = appendLiteral(buf, seg.text, seg.literal)
		}
	}
	if n == 0 {
		buf = append(buf, '/')
	}
	if msgID != "" && n == 4 && method == http.MethodDelete {
		rk.dated = true
		if olderThan14Days(msgID, now()) {
			buf = append(buf, oldMessageSuffix...)
		}
	}
	if tmpl != nil {
		rk.route = tmpl.get(buf).key
	} else {
		rk.route = string(buf)
	}
	return rk
}

// appendLiteral appends a route word, replacing bytes that are not safe in
// a key with '_' unless literal says there are none.
func appendLiteral(buf []byte, seg string, literal bool) []byte {
	if literal {
		return append(buf, seg...)
	}
	for i := 0; i < len(seg); i++ {
		if literalByte(seg[i]) {
			buf = append(buf, seg[i])
		} else {
			buf = append(buf, '_')
		}
	}
	return buf
}

// olderThan14Days reports whether the snowflake id was created more than 14
// days before now. Ids that do not parse are taken as recent.
func olderThan14Days(id string, now time.Time) bool {
	v, err := strconv.ParseUint(id, 10, 64)
	if err != nil {
		return false
	}
	created := int64(v>>22) + discordEpoch
	return now.UnixMilli()-created > (14 * 24 * time.Hour).Milliseconds()
}

// isReaction reports whether route (a method and route template) adds or
// removes a reaction: PUT or DELETE /channels/:id/messages/:id/reactions/...,
// which Discord limits in one bucket per channel.
func isReaction(route string) bool {
	const path = " /channels/:id/messages/:id/reactions/"
	method, rest, ok := strings.Cut(route, " ")
	if !ok || method != http.MethodPut && method != http.MethodDelete {
		return false
	}
	return strings.HasPrefix(" "+rest, path)
}
