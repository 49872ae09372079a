package ratecord

import (
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestKeyerKeepsNoRawSecret keys requests with 300 distinct Authorization
// values of 1 MiB each: with raw headers as cache keys the keyer held
// 300 MiB; with digests it holds a few kilobytes.
func TestKeyerKeepsNoRawSecret(t *testing.T) {
	k := newKeyer([]byte("k"))
	now := time.Now
	req, _ := http.NewRequest("GET", "https://discord.com/api/v10/users/@me", nil)
	buf := []byte("Bot " + strings.Repeat("x", 1<<20))
	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	before := heap()
	ids := map[string]bool{}
	for i := range 300 {
		copy(buf[4:], itoa(uint64(i))+"-")
		req.Header.Set("Authorization", string(buf))
		ids[k.key(req, now).credential] = true
	}
	req.Header.Del("Authorization")
	after := heap()
	if len(ids) != 300 {
		t.Errorf("300 distinct Authorization values gave %d credentials", len(ids))
	}
	if after > before && after-before > 16<<20 {
		t.Errorf("heap grew by %d MiB after keying 300 Authorization values of 1 MiB; want the keyer to keep none",
			(after-before)>>20)
	}
	runtime.KeepAlive(k)

	// Structurally: the caches hold digests and hashes, never a secret.
	k.mu.RLock()
	for _, id := range k.cache {
		if len(id) != 22 {
			t.Errorf("the secret cache holds %q; want only 22-byte hashes", id)
		}
	}
	k.mu.RUnlock()
	if e := k.last.Load(); e == nil || len(e.id) != 22 {
		t.Errorf("last credential = %+v; want a hash", e)
	}
}

func TestPathCacheKeepsNoLongSegment(t *testing.T) {
	t.Parallel()
	k := newKeyer([]byte("k"))
	now := time.Now
	for _, path := range []string{
		"/api/v10/applications/1/" + webhookToken,                    // a long segment: maybe a secret
		"/api/v10/channels/1/" + strings.Repeat("a/", maxCachedPath), // longer than maxCachedPath
	} {
		req, _ := http.NewRequest("GET", "https://discord.com"+path, nil)
		k.key(req, now)
		k.key(req, now)
	}
	for i := range k.paths {
		if e := k.paths[i].Load(); e != nil {
			t.Errorf("the path cache holds %.60q...", e.path)
		}
	}
}
