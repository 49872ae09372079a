// Package store defines the contract between the ratecord transport and the
// places that keep rate-limit state.
//
// A [Store] owns every piece of rate-limit state: which bucket hash a route
// was learned to use, each bucket's limit, remaining count and reset time, the
// global window of every credential, pauses ordered by 429 responses, and the
// invalid-request guard. The transport asks it one question per attempt,
// through [Store.Acquire]: may this request go now? and tells it what the
// response taught through [Store.Update].
//
// Implementations live in their own packages (store/memstore for one process,
// store/redisstore for many) and prove the same semantics by passing the
// conformance suite in store/storetest.
package store

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Store keeps rate-limit state and grants permission to send requests.
//
// Implementations must be safe for concurrent use by multiple goroutines.
type Store interface {
	// Acquire blocks until the request described by c may be sent and returns
	// a Permit for it. Waiters on one bucket are granted in arrival order.
	//
	// Acquire returns early with an error when ctx is done, when c.Done is
	// closed, when the store is closed ([ErrClosed]), or when the store knows
	// that the wait would end after ctx's deadline or after c.MaxWait; those
	// errors are of type *[WaitError]. A refused request (guard, dead
	// credential or webhook) gets a *[WaitError] wrapping the reason as well.
	//
	// A waiter that gives up leaves the queue and gives back any slot it had
	// been granted. Every Permit returned must be followed by exactly one
	// call to Update.
	Acquire(ctx context.Context, c Claim) (Permit, error)

	// Update reports what happened to a request sent under p: the rate-limit
	// headers of its response, a 429, or that it was never sent. It never
	// reopens a window early: stale or partial information only makes the
	// store more conservative. Update must apply u even when ctx is done
	// (the response has arrived; what it says must not be lost): stores
	// doing I/O use context.WithoutCancel(ctx).
	Update(ctx context.Context, p Permit, u Update) error

	// Close releases every waiter with [ErrClosed] and frees the store's
	// resources. Close is idempotent.
	Close() error
}

// Claim describes a request that wants to be sent.
//
// The zero value of each policy field selects the documented default.
type Claim struct {
	// Credential identifies who sends the request: a keyed hash of the
	// Authorization header, or [Unauthenticated]. It never holds a token.
	Credential string
	// Route is the method and route template, e.g.
	// "POST /channels/:id/messages".
	Route string
	// Major is the major parameter, e.g. "channels/123", or "" for routes
	// without one. Webhook and interaction tokens appear only as hashes.
	Major string
	// Global reports whether the request counts against the credential's
	// global limit (interaction callbacks and interaction webhooks do not).
	Global bool
	// TokenAuth reports whether the route authenticates with a token in its
	// path (webhooks, interactions) rather than the Authorization header.
	TokenAuth bool

	// GlobalLimit is the number of requests a credential may send in any
	// window of GlobalWindow. Zero means 50.
	GlobalLimit int
	// GlobalWindow is the length of the sliding global window. Zero means one
	// second.
	GlobalWindow time.Duration
	// Offset bounds how long after its grant the request may reach Discord.
	// Its global slot's window starts when its response arrives (it reached
	// Discord by then), or Offset after the grant if that is earlier, so a
	// request that was slow to leave cannot share a window with later ones.
	Offset time.Duration
	// InvalidBudget is the number of invalid responses (401, 403 and 429
	// other than scope shared) allowed within [InvalidWindow] before the
	// store refuses requests. Zero means 5,000; a negative value disables the
	// guard.
	InvalidBudget int
	// MaxWait is the longest the caller accepts to wait. Zero means no limit
	// other than ctx.
	MaxWait time.Duration
	// Done, when closed, releases the waiter with [ErrClosed]. It may be nil.
	Done <-chan struct{}
}

// Permit is the store's grant for one request. Its fields are set by the
// store that issued it and must be handed back unchanged to [Store.Update].
type Permit struct {
	// Bucket names the counter the request was granted from, for telemetry
	// and errors: the learned bucket hash, or "" when the route's bucket is
	// not known yet or the route has none.
	Bucket string
	// Waited is how long Acquire blocked.
	Waited time.Duration
	// Handle and Token are private to the store that issued the Permit.
	Handle any
	Token  uint64
}

// Update carries what a response taught about the limits.
type Update struct {
	// Credential, Route, Major, Global and TokenAuth repeat the claim.
	Credential string
	Route      string
	Major      string
	Global     bool
	TokenAuth  bool

	// Sent is false when the request never left the process: its slot is
	// given back. A request that failed in flight counts as sent.
	Sent bool
	// Status is the HTTP status of the response, or 0 when none arrived.
	Status int

	// Bucket is the X-RateLimit-Bucket hash, or "".
	Bucket string
	// HasLimit reports whether Limit and Remaining are valid. ResetAfter
	// is negative when the response gave no usable reset: the store then
	// assumes the longest window it has seen for the bucket, and at least
	// one second.
	HasLimit   bool
	Limit      int
	Remaining  int
	ResetAfter time.Duration

	// Scope classifies a 429 response; it is "" for other statuses.
	Scope Scope
	// RetryAfter is how long a 429 asks to wait.
	RetryAfter time.Duration

	// Offset is the safety margin added to every reset and pause.
	Offset time.Duration
	// Cooldown is how long a credential that got a 401, or a webhook that got
	// a 401 or 404, is refused. Zero means ten minutes; negative disables.
	Cooldown time.Duration
}

// Scope says which limit a 429 response or a refusal refers to.
type Scope string

// The scopes of 429 responses, as sent in X-RateLimit-Scope, and the reasons
// ratecord itself refuses or delays a request.
const (
	// ScopeUser is a per-bucket limit of the credential.
	ScopeUser Scope = "user"
	// ScopeGlobal is the credential's global limit.
	ScopeGlobal Scope = "global"
	// ScopeShared is a limit on the resource shared by every client.
	ScopeShared Scope = "shared"
	// ScopeBlocked is a 429 without rate-limit headers or retry_after: a
	// Cloudflare block. Every request of the credential pauses.
	ScopeBlocked Scope = "blocked"
	// ScopeGuard marks a refusal by the invalid-request guard, or of a
	// credential or webhook that recently answered 401 or 404.
	ScopeGuard Scope = "guard"
)

// Unauthenticated is the credential of requests without an Authorization
// header. Discord limits them per IP address, with a global budget of their
// own.
const Unauthenticated = "unauthenticated"

// InvalidWindow is the window over which Discord counts invalid requests.
const InvalidWindow = 10 * time.Minute

// Defaults applied by stores when a Claim or Update leaves a field zero.
const (
	DefaultGlobalLimit   = 50
	DefaultGlobalWindow  = time.Second
	DefaultInvalidBudget = 5000
	DefaultCooldown      = 10 * time.Minute
)

// Errors returned by stores, wrapped in a *WaitError.
var (
	// ErrClosed means the store or the transport was closed.
	ErrClosed = errors.New("ratecord: closed")
	// ErrWaitTooLong means the wait would exceed the claim's MaxWait.
	ErrWaitTooLong = errors.New("ratecord: wait exceeds the maximum")
	// ErrInvalidBudget means the invalid-request guard refused the request.
	ErrInvalidBudget = errors.New("ratecord: invalid-request budget exhausted")
	// ErrUnauthorized means the credential recently got a 401.
	ErrUnauthorized = errors.New("ratecord: credential recently answered 401 Unauthorized")
	// ErrWebhookGone means the webhook recently answered 401 or 404.
	ErrWebhookGone = errors.New("ratecord: webhook recently answered 401 or 404")
)

// WaitError reports why Acquire did not grant a request.
type WaitError struct {
	// Bucket is the bucket hash the request waited on, or "".
	Bucket string
	// Scope is the limit that made the request wait.
	Scope Scope
	// RetryAfter is how long, from the moment of the error, the store expects
	// the wait to last; zero when unknown.
	RetryAfter time.Duration
	// Err is the reason: a context error, ErrClosed, ErrWaitTooLong,
	// ErrInvalidBudget, ErrUnauthorized or ErrWebhookGone.
	Err error
}

// Error describes the cause, the scope and the expected wait.
func (e *WaitError) Error() string {
	s := string(e.Scope)
	if s == "" {
		s = "bucket"
	}
	if e.RetryAfter > 0 {
		return fmt.Sprintf("%v (scope %s, retry after %v)", e.Err, s, e.RetryAfter)
	}
	return fmt.Sprintf("%v (scope %s)", e.Err, s)
}

// Unwrap returns e.Err.
func (e *WaitError) Unwrap() error { return e.Err }

// CheckWait reports whether a wait of d starting at now is known to end
// after ctx's deadline (context.DeadlineExceeded) or after the claim's
// MaxWait ([ErrWaitTooLong]). Stores use it to fail fast.
func CheckWait(ctx context.Context, c *Claim, now time.Time, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && now.Add(d).After(dl) {
		return context.DeadlineExceeded
	}
	if c.MaxWait > 0 && d > c.MaxWait {
		return ErrWaitTooLong
	}
	return nil
}

// ClampDuration bounds d to [0, 24h]: stores use it on durations read from
// responses so that absurd values cannot overflow time arithmetic.
func ClampDuration(d time.Duration) time.Duration {
	const maxDuration = 24 * time.Hour
	if d < 0 {
		return 0
	}
	if d > maxDuration {
		return maxDuration
	}
	return d
}
