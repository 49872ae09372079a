package discordtest

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	mathrand "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// ErrUnknownBucket is returned by [Server.MoveRoute] for a bucket hash that is
// not in the table.
var ErrUnknownBucket = errors.New("discordtest: unknown bucket hash")

// errEdgeLimit is returned for an edge limit without a positive limit,
// window and block.
var errEdgeLimit = errors.New("edge limit: need a positive limit, window and block")

// errNotLoopback is wrapped when an address is not a loopback address.
var errNotLoopback = errors.New("discordtest: only loopback addresses are allowed")

// shutdownTimeout bounds how long Close waits for requests in flight.
const shutdownTimeout = 5 * time.Second

// Server is a running emulator of Discord's REST rate limits. Send requests to
// URL() + "/api/v10/..."; the /api and /api/vN prefixes are optional.
//
// Server is an [http.Handler] too, so it can be mounted elsewhere; the
// listener it starts is then simply unused. All methods are safe for
// concurrent use, also while requests are being served.
type Server struct {
	// mu guards the tables (buckets, routes, globalLimit, maxConcurrency,
	// tokens, deleted resources), the counters, delivered, claimTold,
	// renameTold, waitTold, edgeBlocks, bans, the snowflake sequence,
	// logSeq, lastSweep, stats, stops and what the responses in flight will
	// have told (reached records).
	mu              sync.Mutex
	buckets         map[string]Bucket
	routes          []route
	globalLimit     int
	maxConcurrency  int             // reported by GET /gateway/bot
	tokens          map[string]bool // valid tokens without their Bot/Bearer prefix
	invalidTokens   map[string]bool // tokens that always get 401
	deletedChannels map[string]bool
	deletedWebhooks map[string]bool
	counters        map[counterKey]counter
	late            map[counterKey]*slidingLog    // per global or bucket counter, the requests frozen in flight it counted (see lateFilled)
	delivered       map[deliveredKey]firstReached // when a bucket's headers first reached each process of a credential
	claimTold       map[counterKey]firstReached   // when a 429 of a bucket with a Claim first reached each process of a credential
	renameTold      map[renameKey][]*waitTold     // sublimit 429s sent per credential and channel
	waitTold        map[counterKey][]*waitTold    // 429s of overstated buckets and bare limits, per counter
	edgeBlocks      map[edgeKey]*edgeEpisode      // blocks by edge limits, per client IP
	bans            map[string]time.Time          // client IP -> end of its ban
	seq             int64                         // snowflake sequence
	logSeq          int                           // log entries ever appended, across ResetStats
	lastSweep       time.Time
	stats           statsState
	stops           map[string][]stop // per process name, the spans it was stopped in (see Stopped)

	// Fixed after construction.
	cfg       config
	shared    []sharedLimit
	edge      []edgeLimit
	bare      []bareLimit
	now       func() time.Time
	delays    *delays
	credKey   []byte // HMAC key for credential IDs
	url       string
	http      *http.Server
	done      chan struct{} // closed by Close
	serveDone chan struct{} // closed when the serving goroutine exits
	closeOnce sync.Once
}

var _ http.Handler = (*Server)(nil)

// NewServer starts an emulator on a loopback port, by default a free port of
// 127.0.0.1, like [net/http/httptest.NewServer]. It panics when an option is
// invalid or the address cannot be listened on; use [Start] to get an error
// instead. Call [Server.Close] when done.
func NewServer(opts ...Option) *Server {
	s, err := Start(opts...)
	if err != nil {
		panic(err)
	}
	return s
}

// Start is like [NewServer] but returns an error instead of panicking.
func Start(opts ...Option) (*Server, error) {
	s, err := newServer(opts)
	if err != nil {
		return nil, err
	}
	addr, err := loopbackAddr(s.cfg.addr)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("discordtest: %w", err)
	}
	s.url = "http://" + ln.Addr().String()
	s.http = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		defer close(s.serveDone)
		_ = s.http.Serve(ln) // returns http.ErrServerClosed after Close
	}()
	return s, nil
}

// newServer builds a server from options without listening.
func newServer(opts []Option) (*Server, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		if o != nil {
			o.apply(&cfg)
		}
	}
	var buckets []Bucket
	var routes []Route
	if !cfg.noDefaults {
		buckets, routes = DefaultBuckets(), DefaultRoutes()
	}
	bm, rs, err := buildTable(append(buckets, cfg.buckets...), append(routes, cfg.routes...))
	if err != nil {
		return nil, fmt.Errorf("discordtest: %w", err)
	}
	shared, err := newSharedLimits(cfg.shared)
	if err != nil {
		return nil, err
	}
	bare, err := newBareLimits(cfg.bare)
	if err != nil {
		return nil, fmt.Errorf("discordtest: %w", err)
	}
	edge, err := newEdgeLimits(cfg.edge)
	if err != nil {
		return nil, fmt.Errorf("discordtest: %w", err)
	}
	if cfg.sublimit > 0 && cfg.sublimitWindow <= 0 {
		return nil, errors.New("discordtest: hidden sublimit window must be positive")
	}
	if cfg.invalidLimit > 0 && cfg.invalidWindow <= 0 {
		return nil, errors.New("discordtest: invalid-request window must be positive")
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails
	seed := cfg.seed
	if !cfg.seeded {
		seed = mathrand.Uint64()
	}
	s := &Server{
		buckets:         bm,
		routes:          rs,
		globalLimit:     cfg.globalLimit,
		maxConcurrency:  cfg.maxConcurrency,
		tokens:          tokenSet(cfg.tokens),
		invalidTokens:   tokenSet(cfg.invalidTokens),
		deletedChannels: idSet(cfg.deletedChan),
		deletedWebhooks: idSet(cfg.deletedHook),
		counters:        make(map[counterKey]counter),
		delivered:       make(map[deliveredKey]firstReached),
		claimTold:       make(map[counterKey]firstReached),
		renameTold:      make(map[renameKey][]*waitTold),
		waitTold:        make(map[counterKey][]*waitTold),
		edgeBlocks:      make(map[edgeKey]*edgeEpisode),
		bans:            make(map[string]time.Time),
		cfg:             cfg,
		shared:          shared,
		edge:            edge,
		bare:            bare,
		now:             cfg.now,
		credKey:         key,
		done:            make(chan struct{}),
		serveDone:       make(chan struct{}),
	}
	s.delays = newDelays(cfg.network, seed, s.scale)
	s.lastSweep = s.now()
	s.stats.reset()
	return s, nil
}

// sharedLimit is a SharedLimit with its route template and resource parsed.
type sharedLimit struct {
	SharedLimit
	tmpl     *template // nil matches every route
	resource []segment
}

// newSharedLimits checks and parses the shared limits.
func newSharedLimits(ls []SharedLimit) ([]sharedLimit, error) {
	out := make([]sharedLimit, 0, len(ls))
	for _, sh := range ls {
		if sh.Limit <= 0 || sh.Window <= 0 || sh.Resource == "" {
			return nil, fmt.Errorf("discordtest: shared limit on %q: need a resource, a positive limit and window", sh.Resource)
		}
		l := sharedLimit{SharedLimit: sh}
		for _, p := range strings.Split(strings.Trim(sh.Resource, "/"), "/") {
			switch {
			case p == "" || (strings.ContainsAny(p, "{}") && (len(p) < 3 || p[0] != '{' || p[len(p)-1] != '}')):
				return nil, fmt.Errorf("discordtest: shared limit: bad resource %q", sh.Resource)
			case p[0] == '{':
				l.resource = append(l.resource, segment{wild: true})
			default:
				l.resource = append(l.resource, segment{literal: p})
			}
		}
		if sh.Route != "" {
			t, err := parseTemplate(sh.Route)
			if err != nil {
				return nil, fmt.Errorf("discordtest: shared limit: %w", err)
			}
			l.tmpl = &t
		}
		out = append(out, l)
	}
	return out, nil
}

// match returns the resource of q the limit covers, such as
// "channels/1/messages/2", or "" when it covers none.
func (l *sharedLimit) match(q *request) string {
	if len(q.segs) < len(l.resource) || (l.tmpl != nil && !l.tmpl.match(q.method, q.segs)) {
		return ""
	}
	for i, seg := range l.resource {
		if q.segs[i] == "" || (!seg.wild && seg.literal != q.segs[i]) {
			return ""
		}
	}
	return strings.Join(q.segs[:len(l.resource)], "/")
}

// bareLimit is a BareLimit with its route template parsed.
type bareLimit struct {
	BareLimit
	tmpl template
}

// newBareLimits checks and parses the bare limits.
func newBareLimits(ls []BareLimit) ([]bareLimit, error) {
	out := make([]bareLimit, 0, len(ls))
	for _, l := range ls {
		if l.Route == "" || l.Limit <= 0 || l.Window <= 0 {
			return nil, fmt.Errorf("bare limit on %q: need a route, a positive limit and window", l.Route)
		}
		t, err := parseTemplate(l.Route)
		if err != nil {
			return nil, fmt.Errorf("bare limit: %w", err)
		}
		out = append(out, bareLimit{BareLimit: l, tmpl: t})
	}
	return out, nil
}

// loopbackAddr checks that addr is a loopback address and returns it with
// "localhost" resolved to 127.0.0.1.
func loopbackAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("discordtest: address %q: %w", addr, err)
	}
	if host == "localhost" {
		return net.JoinHostPort("127.0.0.1", port), nil
	}
	ip := net.ParseIP(host)
	if ip == nil || !ip.IsLoopback() {
		return "", fmt.Errorf("%w: %q", errNotLoopback, addr)
	}
	return addr, nil
}

func tokenSet(tokens []string) map[string]bool {
	m := make(map[string]bool, len(tokens))
	for _, t := range tokens {
		m[bareToken(t)] = true
	}
	return m
}

func idSet(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// bareToken strips the "Bot " or "Bearer " prefix of an Authorization value.
func bareToken(auth string) string {
	for _, p := range []string{"Bot ", "Bearer "} {
		if len(auth) > len(p) && strings.EqualFold(auth[:len(p)], p) {
			return auth[len(p):]
		}
	}
	return auth
}

// URL returns the base URL of the emulator, such as "http://127.0.0.1:38211",
// without a trailing slash. Clients append "/api/v10/...". It is empty when
// the server was never started.
func (s *Server) URL() string { return s.url }

// Close stops the emulator: it cuts injected latency short, waits up to five
// seconds for requests in flight, closes every connection and waits for the
// serving goroutine to exit. Close is idempotent; calls after the first do
// nothing. Stats remain readable after Close.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.done)
		if s.http == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		if err := s.http.Shutdown(ctx); err != nil {
			_ = s.http.Close()
		}
		<-s.serveDone
	})
}

// CredentialID returns the short keyed hash that identifies the credential
// of an Authorization header value in [LogEntry]. The key is random per
// server, so IDs reveal nothing about the token and differ between servers.
func (s *Server) CredentialID(authorization string) string {
	m := hmac.New(sha256.New, s.credKey)
	m.Write([]byte(authorization))
	return "cred:" + hex.EncodeToString(m.Sum(nil)[:6])
}

// credentialID identifies a request's credential in stats and logs.
func (s *Server) credentialID(q *request) string {
	if q.auth == "" {
		return "ip:" + q.ip
	}
	return s.CredentialID(q.auth)
}

// ServeHTTP answers one request as Discord would. The request path reads top
// to bottom: draw the network's delays, travel there, key the request and
// decide under the lock at the moment it arrives, travel back, write the
// response.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	handled := s.now()
	sent, frozen := s.sentAt(r, handled)
	up, down := s.delays.draw()
	q := readRequest(r, sent)
	q.frozen = frozen
	upCtx := r.Context()
	if s.cfg.sentArrive {
		// Already on the wire: the client giving up does not stop it.
		upCtx = context.WithoutCancel(upCtx)
	}
	// The way up counts from when the client sent the request.
	if !s.sleep(upCtx, up-handled.Sub(sent)) {
		return
	}
	res := s.decide(q, down)
	if !s.sleep(r.Context(), down) {
		// The client went away: the response reaches no one.
		s.mu.Lock()
		lost(res.told)
		s.markLog(res.entry, func(e *LogEntry) { e.Lost = true })
		s.stats.lost++
		s.mu.Unlock()
		return
	}
	s.respond(w, q, res)
	if len(res.told) == 0 && res.entry < 0 {
		return
	}
	if f, ok := w.(http.Flusher); ok && len(res.told) > 0 {
		f.Flush()
	}
	s.mu.Lock()
	at := s.now()
	written(res.told, at)
	s.markLog(res.entry, func(e *LogEntry) { e.Reached = at })
	s.mu.Unlock()
}

// sleep waits for d. It returns false when the client went away, and stops
// waiting early, returning true, when the server is closing.
func (s *Server) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	c, stop := s.cfg.timer(d)
	defer stop()
	select {
	case <-c:
		return true
	case <-s.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// scale applies the time scale to a configured duration.
func (s *Server) scale(d time.Duration) time.Duration {
	if s.cfg.timeScale == 1 {
		return d
	}
	return time.Duration(float64(d) * s.cfg.timeScale)
}

// SetBucket adds a bucket or replaces the one with the same hash, taking
// effect for the next request. Existing counters keep what they have counted
// and are judged against the new limit and window; switching between fixed and
// sliding starts the bucket's counters afresh.
func (s *Server) SetBucket(b Bucket) error {
	if err := validateBucket(b); err != nil {
		return fmt.Errorf("discordtest: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buckets[b.Hash] = b
	// Clients learn the new limit from the next responses; until one
	// reaches them, a 429 on this bucket could not have been avoided.
	for k := range s.delivered {
		if k.hash == b.Hash {
			delete(s.delivered, k)
		}
	}
	for k := range s.claimTold {
		if k.hash == b.Hash {
			delete(s.claimTold, k)
		}
	}
	for k := range s.waitTold {
		if k.kind == kindBucket && k.hash == b.Hash {
			delete(s.waitTold, k)
		}
	}
	return nil
}

// MoveRoute maps a route template to another bucket hash, or adds the route,
// taking effect for the next request. The route's requests then count on the
// counters of the new hash. It returns an error wrapping [ErrUnknownBucket]
// when hash is not in the table.
func (s *Server) MoveRoute(template, hash string) error {
	t, err := parseTemplate(template)
	if err != nil {
		return fmt.Errorf("discordtest: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.buckets[hash]; !ok {
		return fmt.Errorf("%w: %q", ErrUnknownBucket, hash)
	}
	s.routes = setRoute(s.routes, route{tmpl: t, hash: hash})
	return nil
}

// SetGlobalLimit changes the global limit, in requests per second per
// credential; zero or less disables it. The max_concurrency GET /gateway/bot
// reports stays as it was; [Server.SetMaxConcurrency] changes both.
func (s *Server) SetGlobalLimit(perSecond int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.globalLimit = perSecond
}

// DeleteChannel marks a channel as deleted: from the next request on, requests
// on it get 404 "Unknown Channel".
func (s *Server) DeleteChannel(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deletedChannels[id] = true
}

// DeleteWebhook marks a webhook as deleted: from the next request on,
// requests on it get 404 "Unknown Webhook".
func (s *Server) DeleteWebhook(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.deletedWebhooks[id] = true
}

// ResetLimits forgets every counter, ban, edge block and what clients have
// been told, as if the emulator had just started; the tables and the stats
// are kept.
func (s *Server) ResetLimits() {
	s.mu.Lock()
	defer s.mu.Unlock()
	clear(s.counters)
	clear(s.delivered)
	clear(s.claimTold)
	clear(s.renameTold)
	clear(s.waitTold)
	clear(s.edgeBlocks)
	clear(s.bans)
}
