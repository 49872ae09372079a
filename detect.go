package ratecord

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"time"
)

// Global-limit detection: the transport asks Discord for a bot's gateway
// (GET /gateway/bot) and derives the bot's global limit from its
// session_start_limit.max_concurrency, the way nirn-proxy does.
const (
	// detectEvery is how long a detected limit is kept before it is asked
	// for again.
	detectEvery = 6 * time.Hour
	// detectRetry is how long after a failed detection the next one waits.
	detectRetry = 30 * time.Minute
	// detectTimeout bounds one detection request, waiting included.
	detectTimeout = time.Minute
	// maxDetected bounds the number of bots whose limit is kept.
	maxDetected = 4096
)

// GlobalLimitForConcurrency returns the global limit, in requests per
// second, of a bot whose gateway reports maxConcurrency as its
// session_start_limit.max_concurrency: 50 for 1 (or less); for a larger
// value, which Discord grants to large bots, max(500, 25 × maxConcurrency).
// It is the rule [WithGlobalLimitDetection] applies.
func GlobalLimitForConcurrency(maxConcurrency int) int {
	if maxConcurrency <= 1 {
		return DefaultGlobalLimit
	}
	return max(500, 25*maxConcurrency)
}

// WithGlobalLimitDetection makes the transport find each bot's global
// limit instead of assuming [DefaultGlobalLimit]: the first request of a
// bot (named by its token's user-id segment) starts one GET /gateway/bot
// with the bot's token, through the transport and its limits, on the host
// and API version of that request; its session_start_limit.max_concurrency
// gives the limit ([GlobalLimitForConcurrency]). Until the answer comes
// the bot keeps the default limit, never a higher one. The answer is kept
// for six hours; a failed detection (any status but 200, a body without
// max_concurrency) is not retried for thirty minutes and is never sent
// again at once, so detection cannot add invalid requests in a loop. A
// limit given with [WithBotGlobalLimit] takes precedence. Detection is off
// by default.
func WithGlobalLimitDetection(on bool) Option {
	return optionFunc(func(c *config) { c.detect = on })
}

// DetectedGlobalLimit returns the global limit detected for the bot whose
// user id is botID, or 0 when none was (detection off, not yet asked, or
// failed).
func (t *Transport) DetectedGlobalLimit(botID string) int {
	if t.det == nil {
		return 0
	}
	t.det.mu.Lock()
	defer t.det.mu.Unlock()
	return t.det.bots[botID].limit
}

// detector runs and remembers global-limit detections.
type detector struct {
	mu     sync.Mutex
	bots   map[string]detection // by bot user id
	closed bool                 // the transport closed: no new detection
	wg     sync.WaitGroup
}

// close stops new detections and waits for those running, which the
// transport's closing ends.
func (d *detector) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	d.wg.Wait()
}

type detection struct {
	limit   int       // 0 while unknown
	next    time.Time // when to ask again
	running bool
}

// detectedLimit returns the detected limit of bot id, whose Authorization
// header req carries (0 when unknown), and starts a detection when one is
// due.
func (t *Transport) detectedLimit(req *http.Request, id string) int {
	d := t.det
	now := t.cfg.clock.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.bots[id]
	if d.closed || e.running || ok && now.Before(e.next) {
		return e.limit
	}
	if !ok && len(d.bots) >= maxDetected {
		clear(d.bots) // forgotten limits fall back to the default: safe
	}
	e.running = true
	d.bots[id] = e
	d.wg.Add(1)
	go t.detect(req, id)
	return e.limit
}

// detect asks for the gateway of the bot whose token req carries and
// records the limit it implies.
func (t *Transport) detect(orig *http.Request, id string) {
	defer t.det.wg.Done()
	ctx, cancel := context.WithTimeout(t.ctx, detectTimeout) // Close cancels t.ctx
	defer cancel()
	limit := t.askGateway(WithRequestRetries(ctx, 0), orig)
	now := t.cfg.clock.Now()
	t.det.mu.Lock()
	defer t.det.mu.Unlock()
	e := detection{limit: limit, next: now.Add(detectEvery)}
	if limit == 0 {
		e.limit = t.det.bots[id].limit // keep a limit detected before
		e.next = now.Add(detectRetry)
	}
	t.det.bots[id] = e
}

// askGateway sends GET /gateway/bot with orig's token to orig's host and
// returns the limit its answer implies, or 0.
func (t *Transport) askGateway(ctx context.Context, orig *http.Request) int {
	u := *orig.URL
	u.Path, u.RawPath, u.RawQuery, u.Fragment = apiPrefix(orig.URL.Path)+"/gateway/bot", "", "", ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", orig.Header.Get("Authorization"))
	if ua := orig.Header.Get("User-Agent"); ua != "" {
		req.Header.Set("User-Agent", ua)
	}
	resp, err := t.RoundTrip(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0
	}
	var body struct {
		SessionStartLimit struct {
			MaxConcurrency *int `json:"max_concurrency"`
		} `json:"session_start_limit"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&body) != nil || body.SessionStartLimit.MaxConcurrency == nil {
		return 0
	}
	mc := *body.SessionStartLimit.MaxConcurrency
	if mc < 1 || mc > 1<<16 {
		return 0
	}
	return GlobalLimitForConcurrency(mc)
}

// apiPrefix returns the /api or /api/vN prefix of a Discord API path, or
// /api/v10 when it has none.
func apiPrefix(path string) string {
	rest := TrimAPIPrefix(path)
	if rest == path {
		return "/api/v10"
	}
	return path[:len(path)-len(rest)]
}
