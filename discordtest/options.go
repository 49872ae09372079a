package discordtest

import (
	"time"
)

// Option configures a [Server] at construction. Options are applied in order
// after the defaults; a nil Option is ignored.
type Option interface {
	apply(*config)
}

// optionFunc adapts a function to an Option.
type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// SharedLimit makes a resource busy for everyone: requests to it, from every
// credential together, are limited to Limit per Window, and the excess gets a
// 429 with X-RateLimit-Scope: shared. Shared 429s do not count as invalid
// requests and are never avoidable.
type SharedLimit struct {
	// Route is a route template as in [Route]; empty matches every route on
	// Resource.
	Route string
	// Resource is the resource, the first segments of a request's path: a
	// top-level resource such as "channels/123", "guilds/456" or
	// "webhooks/789" (without a webhook token), or one within it such as
	// "channels/123/messages/456", a message. A segment in braces matches
	// any one segment, and each resource it matches is limited on its own:
	// "channels/123/messages/{message_id}" limits every message of the
	// channel apart.
	Resource string
	// Limit is the number of requests allowed per Window; it must be positive.
	Limit int
	// Window is the length of the fixed window before the time scale.
	Window time.Duration
	// RetryAfter, when longer than the time left in the window, is sent as
	// retry_after instead; Discord's shared retry_after is often far longer
	// than the bucket's reset. It is multiplied by the time scale.
	RetryAfter time.Duration
}

// EdgeLimit is a limit of Discord's edge (Cloudflare), in front of the API:
// requests from one client IP, whatever their token, limited to Limit per
// Window (at most Limit in any Window). No header announces it. The request
// that exceeds it starts a block of that IP for Block: while the block lasts,
// every request of the IP on the limit's routes (on every route with
// Everywhere) gets Cloudflare's 429 with the static JSON body {"code": 0,
// "message": "You are being blocked from accessing our API temporarily ..."}
// (or Body) and no X-RateLimit-* headers, no Via and no Retry-After. Requests
// refused by a block do not count towards the limit, nor as invalid
// requests. With a zero Block there is no block: each request over the
// limit gets that 429 on its own, and the next one that fits passes.
//
// An IP that sends more than BanAfter requests into active blocks of the
// limit within any Block is banned, as by [WithInvalidRequestLimit], for
// [WithBanDuration]. A client that waits a second after each block response
// and then sends one probe at a time sends about one request per second into
// a block, besides the requests it had in flight when the block started, so
// for such a client not to be banned BanAfter should exceed Block in seconds
// plus its concurrency.
//
// See [Stats] for which block responses are avoidable.
type EdgeLimit struct {
	// Route is a route template as in [Route]; empty matches every route.
	Route string
	// Limit is the number of requests allowed per Window; it must be
	// positive.
	Limit int
	// Window is the length of the sliding window before the time scale; it
	// must be positive.
	Window time.Duration
	// Block is how long the IP stays blocked, before the time scale. Zero
	// means no block: the limit refuses the requests over it one by one. It
	// must not be negative.
	Block time.Duration
	// BanAfter is how many requests into active blocks within Block an IP
	// may send before it is banned. Zero means 10; a negative value never
	// bans. Without a block, nothing bans.
	BanAfter int
	// Everywhere makes a block cover every route of the IP, not only those
	// of Route: an edge in front of the whole API, which one busy route
	// sets off.
	Everywhere bool
	// Body, when set, is the body of the limit's 429s instead of
	// Cloudflare's JSON, such as "Too Many Requests".
	Body string
	// ContentType is the Content-Type sent with Body; empty means
	// "text/plain; charset=utf-8". It is ignored without Body.
	ContentType string
}

// BareLimit is a limit of Discord's API that no header announces and whose
// 429s are bare: Retry-After in whole seconds, with Date and Via as on
// every response of the API, and nothing else, no X-RateLimit-* header and
// an empty body. Requests of one credential on one major parameter of
// Route are limited to Limit per Window, a fixed window that opens at the
// first request; a refusal's Retry-After is the time left in the window,
// rounded up to whole seconds.
//
// The limit applies after the route's bucket, if the route is in the table:
// a request the bucket refuses does not count on it, and a request it
// refuses does not count on the bucket. Its 429s count as invalid requests.
// See [Stats] for which are avoidable.
type BareLimit struct {
	// Route is a route template as in [Route]; it must be set.
	Route string
	// Limit is the number of requests allowed per Window; it must be
	// positive.
	Limit int
	// Window is the length of the fixed window before the time scale; it
	// must be positive.
	Window time.Duration
}

// defaultEdgeBanAfter is [EdgeLimit].BanAfter when it is zero.
const defaultEdgeBanAfter = 10

// config is everything NewServer is told, before it is checked.
type config struct {
	addr           string
	noDefaults     bool
	buckets        []Bucket
	routes         []Route
	globalLimit    int
	maxConcurrency int
	timeScale      float64
	network        Network
	seed           uint64
	seeded         bool
	skew           time.Duration
	tokens         []string
	invalidTokens  []string
	deletedChan    []string
	deletedHook    []string
	sublimit       int
	sublimitWindow time.Duration
	shared         []SharedLimit
	edge           []EdgeLimit
	bare           []BareLimit
	sentArrive     bool
	invalidLimit   int
	invalidWindow  time.Duration
	banDuration    time.Duration
	logLimit       int
	propagation    time.Duration
	now            func() time.Time
	timer          func(time.Duration) (<-chan time.Time, func() bool)
}

// defaultConfig returns the defaults: Discord's documented numbers.
func defaultConfig() config {
	return config{
		addr:           "127.0.0.1:0",
		globalLimit:    50,
		maxConcurrency: 1,
		timeScale:      1,
		sublimit:       2,
		sublimitWindow: 10 * time.Minute,
		invalidLimit:   10000,
		invalidWindow:  10 * time.Minute,
		banDuration:    time.Hour,
		logLimit:       10000,
		propagation:    defaultPropagation,
		now:            time.Now,
		timer:          realTimer,
	}
}

// WithAddr sets the address to listen on, such as "127.0.0.1:8089". Only
// loopback addresses ("127.0.0.1", "::1", "localhost") are accepted. The
// default is "127.0.0.1:0", a free port.
func WithAddr(addr string) Option {
	return optionFunc(func(c *config) { c.addr = addr })
}

// WithoutDefaultTable starts from an empty bucket table instead of
// [DefaultBuckets] and [DefaultRoutes], wherever it appears among the options.
// Every route then answers 200 without rate-limit headers unless
// [WithBuckets] and [WithRoutes] add some.
func WithoutDefaultTable() Option {
	return optionFunc(func(c *config) { c.noDefaults = true })
}

// WithBuckets adds buckets to the table, replacing those with the same hash.
func WithBuckets(buckets ...Bucket) Option {
	return optionFunc(func(c *config) { c.buckets = append(c.buckets, buckets...) })
}

// WithRoutes adds routes to the table, replacing those with the same
// template (placeholder names do not matter). Every route's bucket hash must
// be in the table.
func WithRoutes(routes ...Route) Option {
	return optionFunc(func(c *config) { c.routes = append(c.routes, routes...) })
}

// WithGlobalLimit sets the global limit: requests in any one second per
// credential (per client IP for requests without Authorization), counted as
// they arrive whatever their route's answer. Requests refused by the global
// limit itself, refused tokens and the exempt interaction routes do not
// count. Zero or less disables it. The default is 50.
func WithGlobalLimit(perSecond int) Option {
	return optionFunc(func(c *config) { c.globalLimit = perSecond })
}

// WithMaxConcurrency makes the emulator a bot whose gateway allows n
// sessions to start at once: GET /gateway/bot reports n as
// session_start_limit.max_concurrency, and the global limit becomes the one
// that goes with it by the rule nirn-proxy follows, 50 requests per second
// for n = 1 and max(500, 25 × n) for a larger n (16 gives 500, 32 gives 800).
// Like [WithGlobalLimit], which sets the same limit, it applies to every
// credential; whichever of the two comes later among the options sets the
// global limit, so WithMaxConcurrency(16) followed by WithGlobalLimit(50)
// emulates a bot whose /gateway/bot promises more than Discord grants. Values
// below 1 count as 1. The default is 1, with the default global limit of 50.
func WithMaxConcurrency(n int) Option {
	return optionFunc(func(c *config) {
		c.maxConcurrency = max(1, n)
		c.globalLimit = GlobalLimitFor(c.maxConcurrency)
	})
}

// WithTimeScale multiplies every configured window and duration (bucket
// windows, the global second, the hidden sublimit, shared, bare and edge
// windows, edge blocks, invalid-request window, ban and the network's
// delays) by scale, so 0.1 makes a 5 s window last 0.5 s. Headers then report the scaled, real seconds, so a client in
// real time behaves correctly. Zero or less is ignored; the default is 1.
// The clock skew of [WithClockSkew] is not scaled.
func WithTimeScale(scale float64) Option {
	return optionFunc(func(c *config) {
		if scale > 0 {
			c.timeScale = scale
		}
	})
}

// WithLatency adds fixed plus a uniformly random share of jitter to every
// round trip, half of each on the way to Discord (before the rate-limit
// decision) and half on the way back (after it), each half drawn on its own.
// It is shorthand for [WithNetwork] with two equal legs and replaces an
// earlier WithNetwork. Negative values count as zero.
func WithLatency(fixed, jitter time.Duration) Option {
	fixed, jitter = max(0, fixed), max(0, jitter)
	return WithNetwork(Network{
		Up:   Leg{Base: fixed / 2, Jitter: jitter / 2},
		Down: Leg{Base: fixed - fixed/2, Jitter: jitter - jitter/2},
	})
}

// WithClockSkew adds offset to the emulator's clock as seen in
// X-RateLimit-Reset and Date, to emulate a server clock that disagrees with
// the client's. X-RateLimit-Reset-After and retry_after are not affected.
func WithClockSkew(offset time.Duration) Option {
	return optionFunc(func(c *config) { c.skew = offset })
}

// WithTokens registers valid tokens. A token may be given with or without its
// "Bot " or "Bearer " prefix. When no valid token is registered, every token
// not registered by [WithInvalidTokens] is accepted; otherwise other tokens
// get 401.
func WithTokens(tokens ...string) Option {
	return optionFunc(func(c *config) { c.tokens = append(c.tokens, tokens...) })
}

// WithInvalidTokens registers tokens that always get 401.
func WithInvalidTokens(tokens ...string) Option {
	return optionFunc(func(c *config) { c.invalidTokens = append(c.invalidTokens, tokens...) })
}

// WithDeletedChannels marks channels as deleted: requests on them get 404
// with Discord's "Unknown Channel" (code 10003).
func WithDeletedChannels(ids ...string) Option {
	return optionFunc(func(c *config) { c.deletedChan = append(c.deletedChan, ids...) })
}

// WithDeletedWebhooks marks webhooks as deleted: requests on them get 404
// with Discord's "Unknown Webhook" (code 10015). Like Discord, these 404s
// count as invalid requests.
func WithDeletedWebhooks(ids ...string) Option {
	return optionFunc(func(c *config) { c.deletedHook = append(c.deletedHook, ids...) })
}

// WithHiddenSublimit sets the hidden sublimit of PATCH /channels/{id} with a
// name or topic in its JSON body: limit per window per channel, announced by
// no header. Exceeding it gives a 429 with scope user. Zero or less disables
// it. The default is 2 per 10 minutes.
func WithHiddenSublimit(limit int, window time.Duration) Option {
	return optionFunc(func(c *config) { c.sublimit, c.sublimitWindow = limit, window })
}

// WithSharedLimit adds a busy resource; see [SharedLimit].
func WithSharedLimit(l SharedLimit) Option {
	return optionFunc(func(c *config) { c.shared = append(c.shared, l) })
}

// WithEdgeLimit adds a limit of Discord's edge per client IP; see
// [EdgeLimit]. There is none by default.
func WithEdgeLimit(l EdgeLimit) Option {
	return optionFunc(func(c *config) { c.edge = append(c.edge, l) })
}

// WithBareLimit adds a limit whose 429s carry only Retry-After; see
// [BareLimit]. There is none by default.
func WithBareLimit(l BareLimit) Option {
	return optionFunc(func(c *config) { c.bare = append(c.bare, l) })
}

// WithSentRequestsArrive makes a request whose client gives up while it is
// on its way up (the Up leg of the [Network]) arrive and count all the
// same, as a request already sent reaches Discord whatever its client does
// next; its response is then written to no one (see [Stats].Lost). By
// default such a request never arrives, as if it had not left.
func WithSentRequestsArrive() Option {
	return optionFunc(func(c *config) { c.sentArrive = true })
}

// WithInvalidRequestLimit sets how many invalid requests (401, 403, 429
// except scope shared, and 404 from a webhook) one client IP may get within a
// sliding window before it is banned. Zero or less disables banning. The
// default is 10,000 per 10 minutes.
func WithInvalidRequestLimit(limit int, window time.Duration) Option {
	return optionFunc(func(c *config) { c.invalidLimit, c.invalidWindow = limit, window })
}

// WithBanDuration sets how long a ban lasts. The default is one hour.
func WithBanDuration(d time.Duration) Option {
	return optionFunc(func(c *config) { c.banDuration = d })
}

// WithLogLimit sets how many of the most recent requests [Server.Stats]
// keeps in its log. Zero or less keeps none. The default is 10,000.
func WithLogLimit(n int) Option {
	return optionFunc(func(c *config) { c.logLimit = n })
}

// WithPropagation sets how long a response that reached one process of a
// client may take to reach the client's other processes, for telling
// avoidable 429s apart (see [Stats]). Processes are named by [ProcessHeader];
// an edge limit's processes are those behind its client IP, whatever their
// token, and every other limit's are those of one credential.
//
// A request is judged by a response that told its client about a limit only
// if it was sent at least d after that response reached another process, or
// at least a millisecond after it reached the request's own process (the
// time a process needs to read a response before it can hold back a request
// already on its way). A request sent sooner was already on its way: that
// response does not make its 429 avoidable.
//
// The default is 5 ms: sharing through Redis pub/sub takes 0.75–1.7 ms on
// the project's build machine. d is not scaled by [WithTimeScale], as
// propagation takes as long at any time scale. Values below a millisecond
// count as a millisecond (no process learns of a response before the one it
// reached); values above a second count as a second (processes that take
// longer to share what they learn do not share limits).
func WithPropagation(d time.Duration) Option {
	return optionFunc(func(c *config) { c.propagation = min(max(d, reaction), maxPropagation) })
}

// realTimer is time.NewTimer as a channel and a stop function.
func realTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

// withTimer replaces the timers the network's delays wait on, for tests on
// a fake clock.
func withTimer(timer func(time.Duration) (<-chan time.Time, func() bool)) Option {
	return optionFunc(func(c *config) {
		if timer != nil {
			c.timer = timer
		}
	})
}

// withClock replaces the clock, for deterministic tests.
func withClock(now func() time.Time) Option {
	return optionFunc(func(c *config) {
		if now != nil {
			c.now = now
		}
	})
}
