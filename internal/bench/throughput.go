package bench

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// SetThroughput names the scenarios of [Throughput] for -scenario.
const SetThroughput = "throughput"

// Templates of the routes the throughput scenarios use.
const (
	routeMessages = "POST /channels/{channel_id}/messages"
	routeList     = "GET /channels/{channel_id}/messages"
	routeEdit     = "PATCH /channels/{channel_id}"
	routeCallback = "POST /interactions/{interaction_id}/{interaction_token}/callback"
	routeReact    = "PUT /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me"
	routeBan      = "PUT /guilds/{guild_id}/bans/{user_id}"
)

// interactionToken is the token of the interaction the retry-after
// scenario answers: interaction tokens start with base64 of "interaction:".
const interactionToken = "aW50ZXJhY3Rpb246YmVuY2g"

// cancelAfter is how long after a request of the cancel-inflight scenario
// left for the emulator its caller gives up: on Discord's network, often
// after it arrived and before its response came back.
const cancelAfter = 30 * time.Millisecond

// edgeRun is how long the scenarios of edges no header announces run at
// least: the first block pauses for a second or more, and the pace it
// teaches shows after.
const edgeRun = 20 * time.Second

// shortDeadline is the deadline of the requests of the deadline-short
// scenario, whatever the network: shorter than the slowest round trips
// of Discord's.
const shortDeadline = 100 * time.Millisecond

// Throughput returns the scenarios of Discord's answers that leave a client
// to find its own way to the most it may send: 429s that carry only
// Retry-After (retry-after), a plain-text 429 of an edge covering every
// route (html-429), a limit per message below the channel's bucket
// (shared-resources), callers that give up on requests already sent
// (cancel-inflight), headers that overstate the limit (overstated), an edge
// limit below the bucket that refuses without blocking (edge-below), a
// deadline shorter than some round trips (deadline-short) and a first
// burst on a small sliding bucket (probe-sliding). Select them with
// -scenario throughput or by name; n is not used, the deadline of
// deadline-short being fixed.
func Throughput(n discordtest.Network) []Scenario {
	return []Scenario{
		retryAfter(),
		html429(),
		sharedResources(),
		cancelInflight(),
		overstated(),
		edgeBelow(),
		deadlineShort(),
		probeSliding(),
	}
}

// onBuckets selects the log entries of any of the bucket hashes.
func onBuckets(hashes ...string) func(discordtest.LogEntry) bool {
	return func(e discordtest.LogEntry) bool {
		for _, h := range hashes {
			if e.Bucket == h {
				return true
			}
		}
		return false
	}
}

// retryAfter sends messages to 2 channels (3 goroutines each) and
// callbacks of one interaction (3 goroutines, without a token), each route
// in a bucket that announces 5 per second, under a limit no header
// announces of 2 per second per channel or interaction whose 429s are bare:
// Retry-After: 1, Via and nothing else. The late columns show how late the
// request that followed a bare 429 arrived after the wait it named ran out,
// counted from the 429's arrival at the client.
func retryAfter() Scenario {
	const (
		limit, window = 2, time.Second
		channels      = 2
	)
	return Scenario{
		Name: "retry-after",
		Emulator: base(append(append(
			bucket("ramsg", 5, window, true, routeMessages),
			bucket("racb", 5, window, true, routeCallback)...),
			discordtest.WithBareLimit(discordtest.BareLimit{Route: routeMessages, Limit: limit, Window: window}),
			discordtest.WithBareLimit(discordtest.BareLimit{Route: routeCallback, Limit: limit, Window: window}))...),
		Load: func(ctx context.Context, env *Env) {
			var wg sync.WaitGroup
			wg.Go(func() {
				env.Goroutines(ctx, 3*channels, func(ctx context.Context, g int) {
					send(ctx, env, http.MethodPost, fmt.Sprintf("/channels/%d/messages", 3000+g%channels), Bot, `{"content":"hi"}`)
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 3, func(ctx context.Context, g int) {
					send(ctx, env, http.MethodPost, "/interactions/3100/"+interactionToken+"/callback", "", `{"type":4,"data":{"content":"hi"}}`)
				})
			})
			wg.Wait()
		},
		Max:       span(func(d time.Duration) float64 { return (channels + 1) * limit * windows(d, window) }),
		Counted:   onBuckets("ramsg", "racb"),
		RetryLate: bareLate,
		LateNote:  "how late the request after a bare 429 arrived after the 429 reached the client plus its Retry-After (goal: within 100 ms)",
	}
}

// bareLate measures, for each bare 429 (Retry-After only) or run of them
// on one route, credential and major parameter, how late the next request
// there arrived after the wait named ran out: the latest of the 429s'
// arrivals at the client plus their Retry-After. Requests that arrived
// before the wait ran out are not the retry; the emulator judges them.
func bareLate(log []discordtest.LogEntry) []time.Duration {
	type key struct{ route, cred, major string }
	by := map[key][]discordtest.LogEntry{}
	for _, e := range log {
		k := key{e.Route, e.Credential, e.Major}
		by[k] = append(by[k], e)
	}
	var late []time.Duration
	for _, es := range by {
		sort.SliceStable(es, func(i, j int) bool { return es[i].Time.Before(es[j].Time) })
		var end time.Time
		waiting := false
		for _, e := range es {
			if waiting && !e.Time.Before(end) {
				late = append(late, e.Time.Sub(end))
				waiting = false
			}
			if e.Bare && !e.Lost {
				if w := e.Reached.Add(e.RetryAfter); w.After(end) {
					end = w
				}
				waiting = true
			}
		}
	}
	return late
}

// html429 keeps one bot's routes busy (messages to 2 channels, a message
// list, position edits of a channel; each bucket 5 per second) while an
// edge in front of the API limits the message list to 4 per second per
// client IP, announced by no header. Past it, the edge answers a 429 with a
// plain "Too Many Requests" body, no rate-limit headers, no Via and no
// Retry-After, and blocks the IP on every route for a second; it bans
// after more than 40 requests into a block.
func html429() Scenario {
	const (
		edgeLimit, window = 4, time.Second
		channels          = 2
	)
	return Scenario{
		Name: "html-429",
		Emulator: base(append(append(append(
			bucket("hmsg", 5, window, true, routeMessages),
			bucket("hlist", 5, window, true, routeList)...),
			bucket("hedit", 5, window, true, routeEdit)...),
			discordtest.WithEdgeLimit(discordtest.EdgeLimit{Route: routeList, Limit: edgeLimit, Window: window,
				Block: window, BanAfter: 40, Everywhere: true, Body: "Too Many Requests"}))...),
		Load: func(ctx context.Context, env *Env) {
			var wg sync.WaitGroup
			wg.Go(func() {
				env.Goroutines(ctx, 2*channels, func(ctx context.Context, g int) {
					send(ctx, env, http.MethodPost, fmt.Sprintf("/channels/%d/messages", 3200+g%channels), Bot, `{"content":"hi"}`)
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 3, func(ctx context.Context, g int) {
					send(ctx, env, http.MethodGet, "/channels/3210/messages", Bot, "")
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 2, func(ctx context.Context, g int) {
					send(ctx, env, http.MethodPatch, "/channels/3220", Bot, `{"position":1}`)
				})
			})
			wg.Wait()
		},
		Max: span(func(d time.Duration) float64 { return (channels*5 + edgeLimit + 5) * windows(d, window) }),
		// The first block pauses every route; what a client learned from
		// it shows after.
		MinDuration: edgeRun,
		// Nine callers, however many workers: the ban after 40 requests
		// into a block counts on it.
		FixedLoad: true,
	}
}

// sharedResources adds reactions to 2 messages of one channel (3
// goroutines each): the channel's bucket announces 5 per second, and each
// message is busy, limited to 2 per second whoever reacts, which no header
// announces (429s of scope shared).
func sharedResources() Scenario {
	const (
		bucketLimit, sharedLimit, window = 5, 2, time.Second
		messages                         = 2
	)
	return Scenario{
		Name: "shared-resources",
		Emulator: base(append(bucket("sreact", bucketLimit, window, true, routeReact),
			discordtest.WithSharedLimit(discordtest.SharedLimit{Route: routeReact, Resource: "channels/3300/messages/{message_id}",
				Limit: sharedLimit, Window: window}))...),
		Load: func(ctx context.Context, env *Env) {
			env.Goroutines(ctx, 3*messages, func(ctx context.Context, g int) {
				send(ctx, env, http.MethodPut, fmt.Sprintf("/channels/3300/messages/%d/reactions/%%F0%%9F%%91%%8D/@me", 33000+g%messages), Bot, "")
			})
		},
		Max: span(func(d time.Duration) float64 {
			return min(bucketLimit, messages*sharedLimit) * windows(d, window)
		}),
		Counted: onBucket("sreact"),
	}
}

// cancelInflight is a bucket of 5 per second (fixed window) with 6
// callers: half wait for their responses, half give up 30 ms after their
// request left for the emulator, which on Discord's network is often
// before the request arrived and mostly before its response came back.
// Requests given up on still arrive and count; their responses reach no
// one.
func cancelInflight() Scenario {
	const limit, window = 5, time.Second
	return Scenario{
		Name:     "cancel-inflight",
		Emulator: base(append(bucket("cancel", limit, window, true, routeMessages), discordtest.WithSentRequestsArrive())...),
		Load: func(ctx context.Context, env *Env) {
			env.Goroutines(ctx, 6, func(ctx context.Context, g int) {
				if g%2 == 1 {
					send(ctx, env, http.MethodPost, "/channels/3400/messages", Bot, `{"content":"hi"}`)
					if ctx.Err() == nil {
						env.Call(false)
					}
					return
				}
				cctx, canceled := env.CancelAfterSend(ctx, cancelAfter)
				_, err := env.Client.Do(cctx, http.MethodPost, env.API+"/channels/3400/messages", Bot, []byte(`{"content":"hi"}`))
				if ctx.Err() != nil {
					canceled()
					return
				}
				env.Call(canceled() && err != nil)
			})
		},
		Max:     span(func(d time.Duration) float64 { return limit * windows(d, window) }),
		Counted: onBucket("cancel"),
		Late:    fixedLate(limit, window),
	}
}

// overstated bans users of one guild from 4 goroutines: the headers say 5
// per second, counting X-RateLimit-Remaining down from 5, while 1 per
// second passes; the others get 429s of scope user with 0 remaining and
// the real wait as retry_after.
func overstated() Scenario {
	const limit, window = 1, time.Second
	return Scenario{
		Name: "overstated",
		Emulator: base(discordtest.WithBuckets(discordtest.Bucket{Hash: "oban", Limit: limit, Window: window, Fixed: true, Announced: 5}),
			discordtest.WithRoutes(discordtest.Route{Template: routeBan, Bucket: "oban"})),
		Load: func(ctx context.Context, env *Env) {
			var next atomic.Int64
			env.Goroutines(ctx, 4, func(ctx context.Context, g int) {
				send(ctx, env, http.MethodPut, fmt.Sprintf("/guilds/3500/bans/%d", 350_000+next.Add(1)), Bot, "")
			})
		},
		Max:     span(func(d time.Duration) float64 { return limit * windows(d, window) }),
		Counted: onBucket("oban"),
	}
}

// edgeBelow lists messages of one channel from 10 goroutines: the bucket
// announces 20 per second, and an edge in front of it, announced by no
// header, allows 10 per second per client IP, refusing each request over
// that rate with Cloudflare's JSON 429 (no rate-limit headers, no
// Retry-After) without blocking the IP.
func edgeBelow() Scenario {
	const edgeLimit, window = 10, time.Second
	return Scenario{
		Name: "edge-below",
		Emulator: base(append(bucket("below", 20, window, true, routeList),
			discordtest.WithEdgeLimit(discordtest.EdgeLimit{Route: routeList, Limit: edgeLimit, Window: window}))...),
		Load: func(ctx context.Context, env *Env) {
			env.Goroutines(ctx, 10, func(ctx context.Context, g int) {
				send(ctx, env, http.MethodGet, "/channels/3600/messages", Bot, "")
			})
		},
		Max:         span(func(d time.Duration) float64 { return edgeLimit * windows(d, window) }),
		Counted:     onBucket("below"),
		MinDuration: edgeRun,
	}
}

// deadlineShort is the deadline scenario on a bucket of 2 per 2 s (fixed)
// whose 10 callers each give their request 100 ms, less than some round
// trips on Discord's network take.
func deadlineShort() Scenario {
	const limit, window = 2, 2 * time.Second
	return Scenario{
		Name:     "deadline-short",
		Emulator: base(bucket("short", limit, window, true, routeMessages)...),
		Load: func(ctx context.Context, env *Env) {
			env.Goroutines(ctx, 10, func(ctx context.Context, g int) {
				dctx, cancel := context.WithTimeout(ctx, shortDeadline)
				deadline, _ := dctx.Deadline()
				_, err := env.Client.Do(dctx, http.MethodPost, env.API+"/channels/3700/messages", Bot, []byte(`{"content":"hi"}`))
				returned := time.Now()
				cancel()
				if err != nil && ctx.Err() == nil {
					env.Overshoot(returned.Sub(deadline))
					// A request that failed fast returns early: wait for
					// its deadline so the load stays the same.
					sleep(ctx, time.Until(deadline))
				}
			})
		},
		Max:      span(func(d time.Duration) float64 { return limit * windows(d, window) }),
		Counted:  onBucket("short"),
		Deadline: shortDeadline,
	}
}

// probeSliding is a burst of 10 goroutines on a route whose bucket the
// client does not know yet and which turns out to be a sliding window of 2
// per second.
func probeSliding() Scenario {
	const limit, window = 2, time.Second
	return Scenario{
		Name:     "probe-sliding",
		Emulator: base(bucket("probe", limit, window, false, routeMessages)...),
		Load: func(ctx context.Context, env *Env) {
			env.Goroutines(ctx, 10, func(ctx context.Context, g int) {
				send(ctx, env, http.MethodPost, "/channels/3800/messages", Bot, `{"content":"hi"}`)
			})
		},
		Max:     span(func(d time.Duration) float64 { return sliding(limit, window, d) }),
		Counted: onBucket("probe"),
	}
}

// afterSendKey is the context key of an [afterSend].
type afterSendKey struct{}

// afterSend is a cancellation armed when the request that carries it in
// its context first leaves for the emulator.
type afterSend struct {
	d      time.Duration
	cancel context.CancelFunc
	mu     sync.Mutex // guards timer, fired and done
	timer  *time.Timer
	fired  bool
	done   bool
}

// arm starts the timer, once.
func (a *afterSend) arm() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.timer != nil || a.done {
		return
	}
	a.timer = time.AfterFunc(a.d, func() {
		a.mu.Lock()
		a.fired = true
		a.mu.Unlock()
		a.cancel()
	})
}

// stop disarms the timer and reports whether it had fired.
func (a *afterSend) stop() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = true
	if a.timer != nil {
		a.timer.Stop()
	}
	return a.fired
}

// CancelAfterSend returns a context derived from ctx that is canceled d
// after the request made with it first leaves the limiter for the emulator
// (the worker's transport under the limiter arms it), and a function to
// call once the request returned: it releases the context and reports
// whether it was canceled that way.
func (e *Env) CancelAfterSend(ctx context.Context, d time.Duration) (context.Context, func() bool) {
	ctx, cancel := context.WithCancel(ctx)
	a := &afterSend{d: d, cancel: cancel}
	return context.WithValue(ctx, afterSendKey{}, a), func() bool {
		fired := a.stop()
		cancel()
		return fired
	}
}
