package ratecord

import (
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
)

// Option configures a [Transport]. Options are applied in order after the
// defaults; an option given a nil value is ignored.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is fixed once NewTransport returns.
type config struct {
	store       store.Store
	policy      store.Policy // of the memory store NewTransport creates
	policyOpts  []string     // the options that set policy, for the error when WithStore is given too
	botLimits   map[string]int
	detect      bool
	maxWait     time.Duration
	retries     int
	backoff     func() backoff.BackOff
	onEvent     func(Event)
	logger      *slog.Logger
	hashKey     []byte
	retryUnsafe bool
	clock       clock.Clock
	reactions   time.Duration // the spacing of reaction routes; 0: none

	tracerProvider trace.TracerProvider // nil: the global one
	meterProvider  metric.MeterProvider // nil: the global one
	propagate      bool
}

// Defaults of a Transport without options.
const (
	// DefaultGlobalLimit is Discord's default global limit per credential.
	DefaultGlobalLimit = store.DefaultGlobalLimit
	// DefaultGlobalWindow is Discord's window of the global limit. Each
	// request's window is counted from when its response arrived (the
	// request reached Discord by then; at most 250 ms after its grant), so a
	// request that was slow to leave cannot share a window with later ones.
	DefaultGlobalWindow = store.DefaultGlobalWindow
	// DefaultMaxWait is the longest a request waits for a slot.
	DefaultMaxWait = time.Minute
	// DefaultRetries is how many times a request is retried.
	DefaultRetries = 3
	// DefaultResetOffset is added to every reset and retry-after.
	DefaultResetOffset = store.DefaultResetOffset
	// DefaultInvalidBudget is half of Discord's 10,000 invalid requests per
	// ten minutes.
	DefaultInvalidBudget = store.DefaultInvalidBudget
	// DefaultCooldown is how long a credential that answered 401, or a
	// webhook that answered 401 or 404, is refused without asking Discord.
	DefaultCooldown = store.DefaultCooldown
	// DefaultReactionSpacing is Discord's stated limit of the reaction
	// routes, one request per 250 ms, which their headers overstate.
	DefaultReactionSpacing = 250 * time.Millisecond
)

// defaultHashKey keys the hash of credentials when WithHashKey is not used.
// It makes hashes stable across processes; WithHashKey makes them secret.
const defaultHashKey = "ratecord credential hash v1"

func defaultConfig() config {
	return config{
		maxWait:   DefaultMaxWait,
		retries:   DefaultRetries,
		reactions: DefaultReactionSpacing,
		backoff:   defaultBackOff,
		logger:    slog.New(slog.DiscardHandler),
		hashKey:   []byte(defaultHashKey),
		clock:     clock.Real{},
	}
}

// defaultBackOff waits 500 ms, then twice as long each time up to 30 s,
// with 50% jitter.
func defaultBackOff() backoff.BackOff {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 500 * time.Millisecond
	b.MaxInterval = 30 * time.Second
	b.MaxElapsedTime = 0
	b.Reset()
	return b
}

// WithStore makes the transport keep its state in s, which may be shared
// with other transports and processes. The transport does not close s.
// Without it the transport creates, owns and closes a memory store.
//
// The limits every request shares (the global limit, the invalid-request
// budget, cooldowns, the reset offset) are then s's [store.Policy], given
// when s was built (memstore.WithPolicy, redisstore.WithPolicy):
// [NewTransport] panics when WithStore is combined with [WithGlobalLimit],
// [WithResetOffset], [WithInvalidRequestBudget] or [WithCooldown], which
// configure the store the transport creates. [WithBotGlobalLimit] works with
// any store.
func WithStore(s store.Store) Option {
	return optionFunc(func(c *config) {
		if s != nil {
			c.store = s
		}
	})
}

// WithGlobalLimit sets how many requests one credential may send in any
// sliding window of length per, in the memory store the transport creates
// (see [WithStore]). The defaults are [DefaultGlobalLimit] and
// [DefaultGlobalWindow]; a bot with a raised limit may set it here, or with
// [WithBotGlobalLimit] when it shares the transport with other bots. Values
// below one (or a non-positive per) are ignored.
func WithGlobalLimit(n int, per time.Duration) Option {
	return optionFunc(func(c *config) {
		c.setPolicy("WithGlobalLimit")
		if n > 0 {
			c.policy.GlobalLimit = n
		}
		if per > 0 {
			c.policy.GlobalWindow = per
		}
	})
}

// WithBotGlobalLimit gives the bot whose user id is botID its own global
// limit of n requests per global window: Discord raises it for large bots
// on request. The bot is recognised by its token, whose first segment
// encodes its user id, so no token is named in configuration. It works with
// any store, and may be given once per bot; n below one is ignored.
func WithBotGlobalLimit(botID string, n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 || botID == "" {
			return
		}
		if c.botLimits == nil {
			c.botLimits = make(map[string]int)
		}
		c.botLimits[botID] = n
	})
}

// setPolicy records that option name configures the store's policy.
func (c *config) setPolicy(name string) {
	c.policyOpts = append(c.policyOpts, name)
}

// WithMaxWait sets the longest a request may wait for a slot. A request
// whose wait is known to be longer fails at once with a [*RateLimitError]
// wrapping [ErrWaitTooLong]. Zero or negative means no limit other than the
// request's context. The default is [DefaultMaxWait].
func WithMaxWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxWait = max(d, 0) })
}

// WithReactionSpacing sets how far apart the transport sends the requests
// of a channel's reaction bucket (PUT and DELETE
// /channels/{id}/messages/{id}/reactions/...): one at a time, the next d
// after the last response, while the bucket's headers describe a window
// longer than a second, since such headers (200 per ten minutes) have been
// seen to allow far more than Discord accepts. Headers describing a window
// of a second or less are taken at their word: they can overstate by at
// most a window's worth, and a 429 that shows it teaches the real limit as
// on any route. A longer hold learned from a 429 still applies. Zero or
// negative turns the spacing off. The default is [DefaultReactionSpacing].
func WithReactionSpacing(d time.Duration) Option {
	return optionFunc(func(c *config) { c.reactions = max(d, 0) })
}

// WithRetries sets how many times a request that got a 429, a 5xx or a
// network error is sent again. Zero disables retries. The default is
// [DefaultRetries].
func WithRetries(n int) Option {
	return optionFunc(func(c *config) { c.retries = max(n, 0) })
}

// WithBackOff sets the back-off policy for retries that the response does
// not time: 5xx responses, network errors, and Cloudflare blocks when the
// store does not hold them itself (both of ratecord's stores do: see
// [WithBlockPause]). newBackOff is called once per request that needs it.
// A 429 with a retry_after waits exactly that long instead.
func WithBackOff(newBackOff func() backoff.BackOff) Option {
	return optionFunc(func(c *config) {
		if newBackOff != nil {
			c.backoff = newBackOff
		}
	})
}

// WithResetOffset sets the safety margin added to every bucket reset and
// 429 retry-after, absorbing latency and clock jitter between Discord's
// servers, in the memory store the transport creates (see [WithStore]).
// Zero or negative means none. The default is [DefaultResetOffset].
func WithResetOffset(d time.Duration) Option {
	return optionFunc(func(c *config) {
		c.setPolicy("WithResetOffset")
		if d <= 0 {
			d = -1 // store.Policy's "none"
		}
		c.policy.ResetOffset = d
	})
}

// WithInvalidRequestBudget sets how many invalid responses (401, 403, and
// 429 other than scope shared) may arrive within ten minutes before the
// transport refuses to send, keeping clear of Discord's ban at 10,000, in
// the memory store the transport creates (see [WithStore]). Zero or a
// negative n disables the guard. The default is [DefaultInvalidBudget].
func WithInvalidRequestBudget(n int) Option {
	return optionFunc(func(c *config) {
		c.setPolicy("WithInvalidRequestBudget")
		if n == 0 {
			n = -1
		}
		c.policy.InvalidBudget = n
	})
}

// WithCooldown sets how long a credential that answered 401, or a webhook
// or interaction token that answered 401 or 404, fails fast without a
// request to Discord, in the memory store the transport creates (see
// [WithStore]). Zero or a negative d disables it. The default is
// [DefaultCooldown].
func WithCooldown(d time.Duration) Option {
	return optionFunc(func(c *config) {
		c.setPolicy("WithCooldown")
		if d == 0 {
			d = -1
		}
		c.policy.Cooldown = d
	})
}

// WithBlockPause sets how long nothing is sent on a route after a
// Cloudflare block (a 429 that Discord's API did not send), from any
// credential, before one probe may go, and the cap of that pause as it
// doubles with each probe blocked again after the first (the probes go when
// the block has lasted one, two, four... pauses), in the memory store the
// transport creates (see [WithStore]; a store takes them from its
// [store.Policy]). A ban page, or blocks on two routes, hold every route.
// After a block the route is paced by what passed before it (see the
// package documentation). first is at least a second. The defaults are [store.DefaultBlockPause]
// and [store.DefaultBlockPauseMax].
func WithBlockPause(first, max time.Duration) Option {
	return optionFunc(func(c *config) {
		c.setPolicy("WithBlockPause")
		c.policy.BlockPause, c.policy.BlockPauseMax = first, max
	})
}

// WithEventHandler sets a function called when a request is rate limited,
// retried, given up on, or refused by the guard. It is called synchronously
// from the request's goroutine, possibly concurrently: it must be fast and
// safe for concurrent use.
func WithEventHandler(f func(Event)) Option {
	return optionFunc(func(c *config) {
		if f != nil {
			c.onEvent = f
		}
	})
}

// WithLogger sets the logger for rate limits, retries and refusals. Log
// records carry route templates and bucket hashes, never tokens. The default
// discards everything.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) {
		if l != nil {
			c.logger = l
		}
	})
}

// WithHashKey sets the key of the hash that turns Authorization headers and
// webhook tokens into identifiers. Processes that share a store must use
// the same key. Without it a fixed key is used: the hash still cannot be
// reversed, but anyone who knows a token can recognise its hash.
func WithHashKey(key []byte) Option {
	return optionFunc(func(c *config) {
		if len(key) > 0 {
			c.hashKey = append([]byte(nil), key...)
		}
	})
}

// WithRetryNonIdempotent makes 5xx responses and network errors retried for
// every method. By default only GET, HEAD, OPTIONS, TRACE, PUT and DELETE,
// and requests with an Idempotency-Key header, are, because a POST that
// failed in flight may have been carried out. 429s are always retried:
// Discord did not carry them out.
func WithRetryNonIdempotent(on bool) Option {
	return optionFunc(func(c *config) { c.retryUnsafe = on })
}
