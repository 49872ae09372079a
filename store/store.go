// Package store defines the contract between the ratecord transport and the
// places that keep rate-limit state.
//
// A [Store] owns every piece of rate-limit state: which bucket hash a route
// was learned to use, each bucket's limit, remaining count and reset time, the
// global window of every credential, pauses ordered by 429 responses, and the
// invalid-request guard. The transport asks it one question per attempt,
// through [Store.Acquire]: may this request go now? The answer is a
// [Reservation], through which the transport tells the store what the
// response taught ([Reservation.Report]) or that the request was not sent
// ([Reservation.Cancel]).
//
// Implementations live in their own packages (store/memstore for one process,
// store/redisstore for many) and prove the same semantics by passing the
// conformance suite in store/storetest.
package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Store keeps rate-limit state and grants permission to send requests.
//
// Implementations must be safe for concurrent use by multiple goroutines.
// What is the same for every request (the global limit, the invalid-request
// budget, cooldowns, safety margins) is the store's [Policy], given when the
// store is built.
type Store interface {
	// Acquire blocks until the request named by c may be sent and returns a
	// Reservation for it. Waiters on one bucket are granted in arrival order.
	//
	// Acquire returns early with an error when ctx is done, when c.Done is
	// closed, when the store is closed ([ErrClosed]), or when the store knows
	// that the wait would end after ctx's deadline or after c.MaxWait; those
	// errors are of type *[WaitError]. A refused request (guard, dead
	// credential or webhook) gets a *[WaitError] wrapping the reason as well.
	//
	// A waiter that gives up leaves the queue and gives back any slot it had
	// been granted. The caller settles every Reservation it gets, once, with
	// [Reservation.Report] or [Reservation.Cancel].
	Acquire(ctx context.Context, c Claim) (*Reservation, error)

	// Close releases every waiter with [ErrClosed] and frees the store's
	// resources. Close is idempotent.
	Close() error
}

// Estimator is implemented by stores that can tell, without waiting and
// without taking a slot, how long a claim would wait if made now: for job
// systems that schedule a request at its ready time instead of parking a
// worker. The answer is an estimate, a lower bound from what the store
// knows (pauses, the global window, the bucket's reset or drip, the claims
// queued ahead); a wait that a response may end at any moment (a probe of
// the route in flight, which lets the next go when its answer is overdue)
// counts as zero. A claim the store would refuse gets the
// *[WaitError] Acquire would return.
type Estimator interface {
	Estimate(ctx context.Context, c Claim) (time.Duration, error)
}

// Policy is what a store applies to every request. The zero value of each
// field selects the documented default; see [Policy.Normalize].
type Policy struct {
	// GlobalLimit is the number of requests a credential may send in any
	// window of GlobalWindow. Zero means [DefaultGlobalLimit]. A claim may
	// name another limit for its credential ([Claim.GlobalLimit]).
	GlobalLimit int
	// GlobalWindow is the length of the sliding global window. Zero means
	// [DefaultGlobalWindow].
	GlobalWindow time.Duration
	// GlobalHold bounds how long after its grant a request may reach
	// Discord. Its global slot's window starts when its response arrives
	// (it reached Discord by then), or GlobalHold after the grant if that is
	// earlier. A grant, global or not, lapses when its request has not
	// left within half of GlobalHold ([Reservation.SendBy]): a request that
	// was slow to leave is claimed again rather than go on what the store
	// knew before. Zero means
	// [DefaultGlobalHold]; it is never less than ResetOffset.
	GlobalHold time.Duration
	// ResetOffset is the safety margin added to every reset and pause,
	// absorbing latency and clock jitter between Discord's servers. Zero
	// means [DefaultResetOffset]; a negative value means none.
	ResetOffset time.Duration
	// InvalidBudget is the number of invalid responses (401, 403 and 429
	// other than scope shared) allowed within [InvalidWindow] before the
	// store refuses requests. Zero means [DefaultInvalidBudget]; a negative
	// value disables the guard.
	InvalidBudget int
	// Cooldown is how long a credential that got a 401, or a webhook that
	// got a 401 or 404, is refused. Zero means [DefaultCooldown]; a negative
	// value disables it.
	Cooldown time.Duration
	// BlockPause is how long nothing is sent after a header-less 429 (a
	// Cloudflare block) before one probe may go, and BlockPauseMax caps the
	// pause as it doubles with each probe blocked again after the first (the
	// probes go when the block has lasted one, two, four... pauses). Zero means
	// [DefaultBlockPause] and [DefaultBlockPauseMax]; BlockPause is never
	// less than a second, BlockPauseMax never less than BlockPause.
	BlockPause    time.Duration
	BlockPauseMax time.Duration
}

// Normalize returns p with every default filled in, durations bounded to a
// day, and the disabling values made explicit: ResetOffset 0 for none,
// InvalidBudget and Cooldown negative when disabled. Stores call it once,
// when they are built.
func (p Policy) Normalize() Policy {
	if p.GlobalLimit <= 0 {
		p.GlobalLimit = DefaultGlobalLimit
	}
	if p.GlobalWindow <= 0 {
		p.GlobalWindow = DefaultGlobalWindow
	}
	p.GlobalWindow = ClampDuration(p.GlobalWindow)
	switch {
	case p.ResetOffset == 0:
		p.ResetOffset = DefaultResetOffset
	case p.ResetOffset < 0:
		p.ResetOffset = 0
	}
	p.ResetOffset = ClampDuration(p.ResetOffset)
	if p.GlobalHold <= 0 {
		p.GlobalHold = DefaultGlobalHold
	}
	p.GlobalHold = max(ClampDuration(p.GlobalHold), p.ResetOffset)
	switch {
	case p.InvalidBudget == 0:
		p.InvalidBudget = DefaultInvalidBudget
	case p.InvalidBudget < 0:
		p.InvalidBudget = -1
	}
	switch {
	case p.Cooldown == 0:
		p.Cooldown = DefaultCooldown
	case p.Cooldown < 0:
		p.Cooldown = -1
	}
	p.Cooldown = max(-1, min(p.Cooldown, 24*time.Hour))
	if p.BlockPause <= 0 {
		p.BlockPause = DefaultBlockPause
	}
	p.BlockPause = max(ClampDuration(p.BlockPause), time.Second)
	if p.BlockPauseMax <= 0 {
		p.BlockPauseMax = DefaultBlockPauseMax
	}
	p.BlockPauseMax = max(ClampDuration(p.BlockPauseMax), p.BlockPause)
	return p
}

// Limit returns the global limit of a claim's credential: c.GlobalLimit
// when set, else the policy's.
func (p *Policy) Limit(c *Claim) int {
	if c.GlobalLimit > 0 {
		return c.GlobalLimit
	}
	return p.GlobalLimit
}

// Claim names a request that wants to be sent.
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

	// GlobalLimit, when positive, is the credential's own global limit per
	// [Policy.GlobalWindow], for a bot whose limit Discord raised. Every
	// claim of one credential should name the same limit.
	GlobalLimit int
	// MaxWait is the longest the caller accepts to wait. Zero means no limit
	// other than ctx.
	MaxWait time.Duration
	// NoWait asks for a slot now or not at all: when the request cannot be
	// granted at once (its bucket or the global window is spent, a pause
	// lasts, requests are queued ahead of it, or a probe of its route is in
	// flight), Acquire fails at once with [ErrWaitTooLong] and, in the
	// *[WaitError]'s RetryAfter, the store's estimate of the wait (zero when
	// only a response can end it).
	NoWait bool
	// Priority is the request's lane: [PriorityUrgent] requests wait ahead
	// of normal ones for their bucket and the global window, but while
	// normal ones wait at most four urgent grants come in a row, so bulk
	// work keeps one slot in five and is never starved. Within a lane,
	// arrival order holds. Across processes sharing
	// a store, lanes order each process's requests; the processes share a
	// bucket in the order their queues arrived.
	Priority Priority
	// Done, when closed, releases the waiter with [ErrClosed]. It may be nil.
	Done <-chan struct{}

	// Spacing, when positive, holds the claim's bucket to one request in
	// flight at a time, the next one no sooner than Spacing after the last
	// response: for routes whose headers are known to overstate what
	// Discord allows (reactions). A longer hold the store learned from a
	// 429 stays. Zero means none beyond what the store learned.
	Spacing time.Duration
	// Retry reports that the request was granted before and is claimed
	// again to be sent again (after a 429, a 5xx or a network error): it
	// keeps its place, re-entering its lane ahead of the claims that wait
	// there, behind the other retries, instead of behind requests that
	// arrived after it.
	Retry bool
	// Kind names, on a route where the body decides whether a request can
	// hit a hidden sublimit narrower than the route's bucket, which kind
	// the request is: "rename" for a PATCH /channels/{id} that changes the
	// name or topic (2 per 10 minutes, in no header). The claims of the
	// same credential, route, major and Kind go one at a time, in arrival
	// order, across every process sharing the store: the next one is
	// granted once the response of the one before is reported, so no two
	// are in flight when the sublimit's 429 comes. A 429 of scope user on
	// such a claim whose retry_after outlasts the bucket's reset holds only
	// them until it ends; the bucket's other requests go on under its
	// headers. "" means none.
	Kind string
	// Path is the request's URL path: with Route it names the resource a
	// 429 of scope shared limits (a message's reactions, say), which the
	// stores of this module then hold alone, the route's other resources
	// going on. It may hold a webhook's or an interaction's token: a store
	// keeps only a digest of it, never the path. "" means the resource is
	// not known: a shared 429 then holds the claim's bucket.
	Path string
}

// Settler is implemented by stores: it applies what a reservation's
// request taught. [Reservation] calls it at most once per reservation.
type Settler interface {
	Settle(ctx context.Context, r *Reservation, u Update) error
}

// Lapser is implemented by stores whose grants lapse (see
// [Reservation.SendBy]): Lapsed reports, on the store's clock, whether r's
// grant has lapsed. [Reservation.Lapsed] calls it.
type Lapser interface {
	Lapsed(r *Reservation) bool
}

// Reservation is a store's grant for one request: the request may be sent.
// Exactly one report settles it: [Reservation.Report] says what the response
// taught, [Reservation.Cancel] that the request was not sent. Later calls
// do nothing, so a slot is never released twice; a reservation never
// settled keeps its slot (and its bucket's window) until the store forgets
// the bucket.
type Reservation struct {
	// Claim is the claim the reservation grants.
	Claim Claim
	// Bucket names the counter the request was granted from, for telemetry
	// and errors: the learned bucket hash, or "" when the route's bucket is
	// not known yet or the route has none.
	Bucket string
	// Waited is how long Acquire blocked.
	Waited time.Duration
	// SendBy, when not zero, is when the grant lapses, on the issuing
	// store's clock: a request that has not left by then (its process was
	// descheduled, or frozen, between the grant and the write) may reach
	// Discord after the store stopped counting it in the global window,
	// in a bucket window other than the one it was granted in, or after
	// a pause that began meanwhile (which a process of a shared store only
	// learns by claiming again). It must be given back
	// ([Reservation.Cancel]) and claimed again. [Reservation.Lapsed] tells.
	// The stores of this module set it for every grant: half of
	// [Policy.GlobalHold] after the grant, the other half being for the
	// request to reach Discord.
	SendBy time.Time

	settler Settler
	handle  any
	token   uint64
	state   atomic.Uint32
}

var reservations = sync.Pool{New: func() any { return new(Reservation) }}

// NewReservation returns a reservation of c that s settles. Stores call it;
// handle and token are theirs, returned by [Reservation.Handle]. A store
// must not keep the reservation once it has settled it.
func NewReservation(s Settler, c Claim, bucket string, waited time.Duration, handle any, token uint64) *Reservation {
	r := reservations.Get().(*Reservation)
	r.Claim, r.Bucket, r.Waited, r.SendBy = c, bucket, waited, time.Time{}
	r.settler, r.handle, r.token = s, handle, token
	r.state.Store(0)
	return r
}

// Recycle lets a later reservation reuse r's memory, sparing an
// allocation per request. It is optional, for callers that hold r alone:
// after Recycle, r must not be used at all. Recycle of a reservation not
// yet settled cancels it first.
func (r *Reservation) Recycle() {
	r.Cancel()
	*r = Reservation{}
	reservations.Put(r)
}

// Handle returns what the issuing store recorded in the reservation.
func (r *Reservation) Handle() (handle any, token uint64) { return r.handle, r.token }

// Report tells the store what happened to the request: the rate-limit
// headers of its response, a 429, or (u.Sent false) that it was never
// sent, which gives its slot back. It never reopens a window early: stale
// or partial information only makes the store more conservative. A store
// applies u even when ctx is done (the response has arrived; what it says
// must not be lost). Report returns [ErrSettled] when the reservation was
// already settled, and then changes nothing.
func (r *Reservation) Report(ctx context.Context, u Update) error {
	if !r.state.CompareAndSwap(0, 1) {
		return ErrSettled
	}
	return r.settler.Settle(ctx, r, u)
}

// Cancel gives the reservation's slot back: the request was not sent. It
// does nothing when the reservation was already settled.
func (r *Reservation) Cancel() {
	_ = r.Report(context.Background(), Update{})
}

// Lapsed reports whether the grant has lapsed: the request must not be
// sent on it. A grant lapses at SendBy, and, with the stores of this
// module, once a response that reached any of their processes after the
// grant spent its bucket: a 429 paused it, or a lowered limit left it
// fewer slots than it had granted. The caller cancels r and claims again.
// A caller checks just before it hands the request to the network, after
// every wait of its own; the grant is good when its store does not
// implement [Lapser].
func (r *Reservation) Lapsed() bool {
	if r.SendBy.IsZero() {
		return false
	}
	l, ok := r.settler.(Lapser)
	return ok && l.Lapsed(r)
}

// Settled reports whether Report or Cancel was called.
func (r *Reservation) Settled() bool { return r.state.Load() != 0 }

// Update carries what a response taught about the limits.
type Update struct {
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
	// Reset is X-RateLimit-Reset: when the bucket is full again, on
	// Discord's clock, or the zero time when the response gave none.
	// Clocks differ, so stores only compare it with other responses'
	// Reset: network jitter blurs arrival times, Discord's clock does not
	// (it is how a sliding window shows).
	Reset time.Time

	// Scope classifies a 429 response; it is "" for other statuses.
	Scope Scope
	// RetryAfter is how long a 429 asks to wait.
	RetryAfter time.Duration
	// Ban reports that a 429 of scope [ScopeBlocked] covers the whole IP
	// address: a Cloudflare ban page (an HTML page, "error code: 1015" or
	// the static JSON with code 0), or any body that is not JSON, which
	// Discord's API never sends. Every request of the store pauses, not
	// only those of the route.
	Ban bool
}

// Priority is a request's lane.
type Priority int

// The lanes.
const (
	// PriorityNormal is the default lane, for bulk work too.
	PriorityNormal Priority = 0
	// PriorityUrgent goes ahead of the normal lane: replies to slash
	// commands, moderation actions.
	PriorityUrgent Priority = 1
)

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
	// ScopeBlocked is a 429 that Discord's API did not send, or that says
	// neither what it limits nor for how long: no rate-limit headers, no
	// retry_after, and no Retry-After beside an empty or JSON body (that
	// one is a wait of scope user). It is a Cloudflare
	// block, which is per IP address: stores that implement [BlockGate]
	// hold every request of the route, from every credential, for at least
	// [Policy.BlockPause], then let one probe through at a time; a ban page
	// ([Update.Ban]) or blocks on two routes hold every request. Once the
	// block ends, the stores of this module pace the route by what passed
	// before it.
	ScopeBlocked Scope = "blocked"
	// ScopeGuard marks a refusal by the invalid-request guard, or of a
	// credential or webhook that recently answered 401 or 404.
	ScopeGuard Scope = "guard"
)

// BlockGate is implemented by stores that hold Cloudflare blocks
// ([ScopeBlocked]) themselves, across credentials and, for a shared store,
// across processes: a transport then retries a blocked request through the
// store, which times the pause and lets one probe go at a time. With a
// store that does not implement it, the transport backs off each blocked
// request on its own.
type BlockGate interface {
	// BlockedFor returns how long the store holds a claim on route (a
	// [Claim.Route]) for a block at least, from what this process knows
	// and without I/O; zero when no block holds it.
	BlockedFor(route string) time.Duration
	// Holding reports whether a block that arrived after r was granted
	// now holds its request (r is not the block's probe): the transport
	// then cancels r and claims again instead of sending. It takes no I/O.
	Holding(r *Reservation) bool
}

// Unauthenticated is the credential of requests without an Authorization
// header. Discord limits them per IP address, with a global budget of their
// own.
const Unauthenticated = "unauthenticated"

// InvalidWindow is the window over which Discord counts invalid requests.
const InvalidWindow = 10 * time.Minute

// Defaults of a [Policy] field left zero.
const (
	// DefaultGlobalLimit is Discord's default global limit per credential.
	DefaultGlobalLimit = 50
	// DefaultGlobalWindow is Discord's window of the global limit.
	DefaultGlobalWindow = time.Second
	// DefaultGlobalHold is how long after its grant a request's global
	// slot is counted from at the latest: it may sit that long in local
	// queues and connection setup before it reaches Discord.
	DefaultGlobalHold = 250 * time.Millisecond
	// DefaultResetOffset is added to every reset and retry-after.
	DefaultResetOffset = 10 * time.Millisecond
	// DefaultInvalidBudget is half of Discord's 10,000 invalid requests per
	// ten minutes.
	DefaultInvalidBudget = 5000
	// DefaultCooldown is how long a credential that answered 401, or a
	// webhook that answered 401 or 404, is refused without asking Discord.
	DefaultCooldown = 10 * time.Minute
	// DefaultBlockPause is the first pause after a Cloudflare block: a
	// second, the least that keeps every route of the IP quiet for as long
	// as a block may last without a word, and a fifth more for the clocks
	// of processes and networks that date the block a little apart.
	DefaultBlockPause = 1200 * time.Millisecond
	// DefaultBlockPauseMax caps the pause after blocks that repeat.
	DefaultBlockPauseMax = time.Minute
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
	// ErrSettled means a reservation was reported or cancelled already.
	ErrSettled = errors.New("ratecord: reservation already settled")
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
// MaxWait, or at all under NoWait ([ErrWaitTooLong]). Stores use it to fail
// fast. A wait past both gets an error that errors.Is matches with either.
func CheckWait(ctx context.Context, c *Claim, now time.Time, d time.Duration) error {
	dl, ok := ctx.Deadline()
	return Exceeds(ok && now.Add(d).After(dl), c.MaxWait > 0 && d > c.MaxWait || c.NoWait && d > 0)
}

// Exceeds returns the error of a wait known to end after the context's
// deadline (deadline), after the longest wait the claim accepts (tooLong),
// both, or neither (nil).
func Exceeds(deadline, tooLong bool) error {
	switch {
	case deadline && tooLong:
		return errBoth
	case deadline:
		return context.DeadlineExceeded
	case tooLong:
		return ErrWaitTooLong
	}
	return nil
}

// errBoth is the error of a wait past both the deadline and the maximum.
var errBoth error = exceedsBoth{}

type exceedsBoth struct{}

func (exceedsBoth) Error() string {
	return "ratecord: wait exceeds the maximum and the context's deadline"
}

// Is reports whether target is [ErrWaitTooLong] or
// context.DeadlineExceeded: the wait exceeds both.
func (exceedsBoth) Is(target error) bool {
	return target == ErrWaitTooLong || target == context.DeadlineExceeded
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
