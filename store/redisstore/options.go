package redisstore

import (
	"log/slog"
	"time"

	"github.com/ratecord/ratecord/store"
)

// Option configures a Store. Options are applied in order over the
// defaults; a nil Option is ignored.
type Option interface{ apply(*Store) }

type optionFunc func(*Store)

func (f optionFunc) apply(s *Store) { f(s) }

// FailurePolicy says what a Store does when Redis cannot be reached.
type FailurePolicy int

const (
	// FailOpen, the default, keeps granting requests through a limiter local
	// to the process, with a conservative share of every limit (see
	// [WithLocalShare]), and returns to Redis by itself once it answers
	// again. Each switch is logged and counted in [Stats].
	FailOpen FailurePolicy = iota
	// FailClosed refuses requests while Redis cannot be reached: Acquire
	// returns a *[store.WaitError] wrapping [ErrUnavailable] and the cause.
	FailClosed
)

// String returns "fail-open" or "fail-closed".
func (p FailurePolicy) String() string {
	if p == FailClosed {
		return "fail-closed"
	}
	return "fail-open"
}

// Defaults of the options.
const (
	DefaultPrefix         = "ratecord"
	DefaultLocalShare     = 4
	DefaultPendingTimeout = 2 * time.Minute
	DefaultPushWait       = 500 * time.Millisecond
	DefaultTicketGrace    = 100 * time.Millisecond
	DefaultProbeInterval  = time.Second
	DefaultMaxBatch       = 64
	DefaultLease          = 8
	DefaultCallTimeout    = 500 * time.Millisecond
	DefaultOutboxLimit    = 10000
)

// WithPolicy sets what the Store applies to every request: the global
// limit and window, the invalid-request budget, cooldowns and safety
// margins. Every process sharing a prefix must give the same policy.
// Without it the Store applies the zero Policy's defaults.
func WithPolicy(p store.Policy) Option {
	return optionFunc(func(s *Store) { s.pol = p })
}

// WithPrefix sets the prefix of every key the Store writes (default
// [DefaultPrefix]). Stores with different prefixes share nothing, even on
// one server. An empty prefix is ignored.
func WithPrefix(prefix string) Option {
	return optionFunc(func(s *Store) {
		if prefix != "" {
			s.prefix = prefix
		}
	})
}

// WithFailurePolicy sets what the Store does when Redis cannot be reached
// (default [FailOpen]).
func WithFailurePolicy(p FailurePolicy) Option {
	return optionFunc(func(s *Store) {
		if p == FailOpen || p == FailClosed {
			s.policy = p
		}
	})
}

// WithLocalShare sets the number of processes assumed to share each
// credential while Redis is unreachable under [FailOpen] (default
// [DefaultLocalShare]): the local limiter then allows each process 1/n of
// the global limit and of every bucket's limit; a bucket of fewer than n
// requests per window waits for Redis instead. Values below 1 are ignored.
func WithLocalShare(n int) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.share = n
		}
	})
}

// WithLogger sets the logger that reports switches to and from the local
// limiter (default: none). A nil logger is ignored.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(s *Store) {
		if l != nil {
			s.log = l
		}
	})
}

// WithOnFallback sets a function called with the Redis error each time the
// Store switches to its local limiter under [FailOpen], for metrics. It is
// called from the goroutine that saw the error and must not block. A nil
// function is ignored.
func WithOnFallback(f func(error)) Option {
	return optionFunc(func(s *Store) {
		if f != nil {
			s.onFallback = f
		}
	})
}

// WithPendingTimeout sets how long a granted request counts as in flight
// when its Update never comes (default [DefaultPendingTimeout]): a bucket
// whose window has passed refills only once every request granted in it was
// reported or timed out, so a crashed process blocks a bucket at most this
// long. It should exceed the longest request. Values <= 0 are ignored.
func WithPendingTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.pendingTimeout = d
		}
	})
}

// WithPushWait sets how long a waiter that only another process's report
// can free (a probe of its route in flight, a window whose requests have
// not all answered) waits before its process asks Redis again, should the
// push that would tell it be lost (default [DefaultPushWait]). Pushes
// come as soon as the report is applied; this is only the fallback. Values
// <= 0 are ignored.
func WithPushWait(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.pushWait = d
		}
	})
}

// WithTicketGrace sets how long past the turn it expected a process's
// place in a line (its ticket) holds when the process does not claim it
// (default [DefaultTicketGrace]): a process that stopped, or whose waiters
// all gave up, keeps the processes behind it waiting at most this long.
// It should exceed a round trip to Redis and the time a running process
// takes to claim once told its turn came (a few milliseconds): a holder
// that has not claimed by then has most likely stopped, and every process
// behind it waits for it. Values <= 0 are ignored.
func WithTicketGrace(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.grace = d
		}
	})
}

// WithProbeInterval sets how often a Store that fell back to its local
// limiter checks whether Redis answers again (default
// [DefaultProbeInterval]). Values <= 0 are ignored.
func WithProbeInterval(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.probeEvery = d
		}
	})
}

// WithMaxBatch sets how many waiters of one process queue a single claim
// may grant at once (default [DefaultMaxBatch]). 1 disables batching.
// Values below 1 are ignored.
func WithMaxBatch(n int) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.maxBatch = n
		}
	})
}

// WithInvalidGroup names the group of processes whose invalid responses
// (401, 403, and 429 other than scope shared) count together against the
// claims' invalid-request budget. Discord counts them per IP address and
// bans the address past 10,000 in ten minutes: processes that share an
// address should share a group. The default, "", makes every process of
// the key prefix one group, which is right for one host or for hosts
// behind one address, and conservative otherwise.
func WithInvalidGroup(name string) Option {
	return optionFunc(func(s *Store) { s.invalidGroup = name })
}

// WithCallTimeout bounds every Redis call the Store makes (default
// [DefaultCallTimeout]). A call that has not answered by then counts as a
// failure: under [FailOpen] the Store falls back to its local limiter, under
// [FailClosed] the waiters it served get an error wrapping
// [ErrUnavailable]. So a Redis server that stalls (a long command, a
// failover, a paused client) is handled like one that is down, within about
// this long. The call itself ends then only if the client honours context
// deadlines (go-redis' ContextTimeoutEnabled); otherwise it goes on in the
// background until the client's own timeouts end it. It should be well
// above the slowest answer of a healthy server. Values <= 0 are ignored.
func WithCallTimeout(d time.Duration) Option {
	return optionFunc(func(s *Store) {
		if d > 0 {
			s.callTimeout = d
		}
	})
}

// WithOutboxLimit sets how many reports of one credential the Store keeps
// while Redis cannot take them (default [DefaultOutboxLimit]). When a
// credential's reports fill it the oldest is dropped and counted in
// [Stats].Dropped; a permit whose report was dropped holds its bucket
// until the pending timeout
// ([WithPendingTimeout]). Values below 1 are ignored.
func WithOutboxLimit(n int) Option {
	return optionFunc(func(s *Store) {
		if n >= 1 {
			s.outboxLimit = n
		}
	})
}

// WithLease sets how many slots beyond its waiters a queue of a hot route
// may take in one claim, for its next waiters to use without a round trip
// (default [DefaultLease]). A claim lends slots only from a bucket no other
// process waits on and that has at least 64 slots free, at most a quarter
// of what is free in the bucket and in the global window, and unused slots
// go back within 25 ms. 0 disables leases. Negative values are ignored.
func WithLease(n int) Option {
	return optionFunc(func(s *Store) {
		if n >= 0 {
			s.leaseMax = n
		}
	})
}
