package ratecord

import (
	"context"
	"time"

	"github.com/ratecord/ratecord/store"
)

// control is what a request's context asks of the transport, beyond its
// deadline.
type control struct {
	maxWait    time.Duration
	hasMaxWait bool
	retries    int
	hasRetries bool
	priority   Priority
}

// Priority is a request's lane; see [WithRequestPriority].
type Priority = store.Priority

// The lanes of [WithRequestPriority].
const (
	// PriorityNormal is the default lane, for bulk work too.
	PriorityNormal = store.PriorityNormal
	// PriorityUrgent goes ahead of the normal lane.
	PriorityUrgent = store.PriorityUrgent
)

type controlKey struct{}

func controlOf(ctx context.Context) control {
	c, _ := ctx.Value(controlKey{}).(control)
	return c
}

// WithRequestMaxWait returns a copy of ctx under which a request waits at
// most d for a slot, in place of the transport's [WithMaxWait]. With d zero
// or negative the request never waits: when it cannot be sent at once (its
// bucket or the global window is spent, a pause lasts, requests are queued
// ahead of it, or a first request of its route is still out), RoundTrip
// fails at once with a [*RateLimitError] wrapping [ErrWaitTooLong], whose
// RetryAfter says how long the wait would have lasted (zero when only a
// response could tell). A wait known to pass both the maximum and the
// context's deadline gets an error that errors.Is matches with either.
func WithRequestMaxWait(ctx context.Context, d time.Duration) context.Context {
	c := controlOf(ctx)
	c.maxWait, c.hasMaxWait = max(d, 0), true
	return context.WithValue(ctx, controlKey{}, c)
}

// WithRequestPriority returns a copy of ctx under which a request waits in
// lane p. On one token, a slash-command reply or a moderation action marked
// [PriorityUrgent] goes ahead of bulk work (a role sync) waiting for the
// same bucket or for the credential's global window; while bulk requests
// wait, at most four urgent ones go in a row, so bulk work keeps one slot
// in five and is never starved; within a lane requests keep their arrival
// order. Both stores honour it;
// across processes sharing a Redis store, lanes order each process's
// requests.
func WithRequestPriority(ctx context.Context, p Priority) context.Context {
	c := controlOf(ctx)
	c.priority = p
	return context.WithValue(ctx, controlKey{}, c)
}

// WithRequestRetries returns a copy of ctx under which a request is sent
// again at most n times after a 429, a 5xx or a network error, in place of
// the transport's [WithRetries]; n zero or negative means never.
func WithRequestRetries(ctx context.Context, n int) context.Context {
	c := controlOf(ctx)
	c.retries, c.hasRetries = max(n, 0), true
	return context.WithValue(ctx, controlKey{}, c)
}
