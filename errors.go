package ratecord

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ratecord/ratecord/store"
)

// Scope says which limit a 429 or a refusal refers to. The values are those
// of the store package.
type Scope = store.Scope

// Scopes of 429 responses, and of ratecord's own refusals.
const (
	ScopeUser    Scope = store.ScopeUser
	ScopeGlobal  Scope = store.ScopeGlobal
	ScopeShared  Scope = store.ScopeShared
	ScopeBlocked Scope = store.ScopeBlocked
	ScopeGuard   Scope = store.ScopeGuard
)

// Reasons a [RateLimitError] wraps, besides context errors. They are the
// store package's errors, so errors.Is works whichever store is used.
var (
	// ErrClosed: the Transport (or its store) was closed.
	ErrClosed = store.ErrClosed
	// ErrWaitTooLong: the wait would exceed the maximum set by WithMaxWait.
	ErrWaitTooLong = store.ErrWaitTooLong
	// ErrInvalidBudget: the invalid-request guard refused to send.
	ErrInvalidBudget = store.ErrInvalidBudget
	// ErrUnauthorized: the credential answered 401 recently.
	ErrUnauthorized = store.ErrUnauthorized
	// ErrWebhookGone: the webhook or interaction token answered 401 or 404
	// recently.
	ErrWebhookGone = store.ErrWebhookGone
)

// Reason returns a short, stable name for why ratecord gave up on a
// request, for metrics labels, logs and API answers: "wait_too_long",
// "invalid_budget", "unauthorized", "webhook_gone", "closed",
// "deadline_exceeded" or "canceled", after the first of those reasons err
// wraps; "" when it wraps none. It never contains a token.
func Reason(err error) string {
	for _, r := range [...]struct {
		err  error
		name string
	}{
		{ErrWaitTooLong, "wait_too_long"},
		{ErrInvalidBudget, "invalid_budget"},
		{ErrUnauthorized, "unauthorized"},
		{ErrWebhookGone, "webhook_gone"},
		{ErrClosed, "closed"},
		{context.DeadlineExceeded, "deadline_exceeded"},
		{context.Canceled, "canceled"},
	} {
		if errors.Is(err, r.err) {
			return r.name
		}
	}
	return ""
}

// RateLimitError is returned by [Transport.RoundTrip] when ratecord gave up
// on a request because of a rate limit: the wait would pass the context's
// deadline or the maximum wait, the context ended while waiting, the guard
// refused it, the transport was closed, or the store failed.
//
// It works with errors.As, and errors.Is sees through it to the cause, so
// errors.Is(err, context.DeadlineExceeded) holds when the deadline made
// ratecord give up.
type RateLimitError struct {
	// Route is the route template, e.g. "POST /channels/:id/messages".
	Route string
	// Bucket is the bucket hash, or "" when not known.
	Bucket string
	// Scope is the limit that stopped the request.
	Scope Scope
	// RetryAfter is how long the limit was expected to last from the moment
	// of the error; zero when unknown.
	RetryAfter time.Duration
	// Err is the cause.
	Err error
}

// Error describes the give-up: route, scope, bucket, expected wait and
// cause. It never contains a token.
func (e *RateLimitError) Error() string {
	scope := string(e.Scope)
	if scope == "" {
		scope = "unknown"
	}
	s := fmt.Sprintf("ratecord: %s: gave up (scope %s", e.Route, scope)
	if e.Bucket != "" {
		s += ", bucket " + e.Bucket
	}
	if e.RetryAfter > 0 {
		s += fmt.Sprintf(", retry after %v", e.RetryAfter)
	}
	return s + "): " + e.Err.Error()
}

// Unwrap returns the cause.
func (e *RateLimitError) Unwrap() error { return e.Err }

// EventKind says what an [Event] reports.
type EventKind int

// The kinds of events.
const (
	// EventRateLimited: Discord answered 429.
	EventRateLimited EventKind = iota + 1
	// EventRetrying: the request is about to be sent again.
	EventRetrying
	// EventGaveUp: ratecord returned an error or the last failed response
	// instead of sending again.
	EventGaveUp
	// EventGuardTripped: the invalid-request guard or a 401/404 cooldown
	// refused the request.
	EventGuardTripped
	// EventLapsed: the request's grant lapsed before it could leave: its
	// process was descheduled or frozen between the grant and the write
	// (see [store.Reservation.SendBy]), or a response that came after the
	// grant spent its bucket (a 429, a lowered limit; see
	// [store.Reservation.Lapsed]). It is claimed again, keeping its place
	// in line, rather than reach Discord after its slot stopped counting
	// or into the 429 another request met. Its Scope is global for a claim
	// that counts against the global window, user otherwise.
	EventLapsed
)

// String returns the kind's name, such as "rate_limited".
func (k EventKind) String() string {
	switch k {
	case EventRateLimited:
		return "rate_limited"
	case EventRetrying:
		return "retrying"
	case EventGaveUp:
		return "gave_up"
	case EventGuardTripped:
		return "guard_tripped"
	case EventLapsed:
		return "lapsed"
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Event reports something a request went through. It holds no token.
type Event struct {
	Kind EventKind
	// Route is the route template.
	Route string
	// Bucket is the bucket hash, or "".
	Bucket string
	// Scope is the 429's scope or the limit that refused the request.
	Scope Scope
	// Status is the HTTP status of the response, or 0.
	Status int
	// RetryAfter is the wait the response or the store asked for.
	RetryAfter time.Duration
	// Attempt counts from 1 for the first sending.
	Attempt int
	// Err is the error given up with, if any.
	Err error
}
