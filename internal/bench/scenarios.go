package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
)

// Bot is the Authorization header of the benchmark's bot; BadBot is one the
// emulator does not know. EdgeBots are the bots of the edge-block scenario,
// which share one client IP.
const (
	Bot    = "Bot bench-good-token"
	BadBot = "Bot bench-revoked-token"
)

// EdgeBots are the Authorization headers of the bots of the edge-block
// scenario: several bots behind one client IP.
var EdgeBots = []string{Bot, "Bot bench-second-token", "Bot bench-third-token"}

// Emulator limits shared by the scenarios. Windows are short so that a run
// of a few seconds spans many of them. The network between the clients and
// the emulator is the run's (see [Options].Network).
const (
	globalPerSecond = 50
	invalidLimit    = 500 // per invalidWindow, then a ban
	invalidWindow   = time.Minute
	// deadlineSlack is how long a request of the deadline scenario may
	// take beyond the network's longest round trip.
	deadlineSlack = 50 * time.Millisecond
)

// DeadlineFor is the deadline of the requests of the deadline scenario on
// network n: 50 ms plus n's longest round trip without a stall, so that a
// request sent as its slot opens can come back in time on any network.
func DeadlineFor(n discordtest.Network) time.Duration { return deadlineSlack + n.MaxRoundTrip() }

func base(extra ...discordtest.Option) []discordtest.Option {
	return append([]discordtest.Option{
		discordtest.WithoutDefaultTable(),
		discordtest.WithGlobalLimit(globalPerSecond),
		discordtest.WithTokens(Bot),
		discordtest.WithInvalidRequestLimit(invalidLimit, invalidWindow),
		discordtest.WithBanDuration(time.Minute),
	}, extra...)
}

func bucket(hash string, limit int, window time.Duration, fixed bool, templates ...string) []discordtest.Option {
	opts := []discordtest.Option{discordtest.WithBuckets(discordtest.Bucket{Hash: hash, Limit: limit, Window: window, Fixed: fixed})}
	for _, t := range templates {
		opts = append(opts, discordtest.WithRoutes(discordtest.Route{Template: t, Bucket: hash}))
	}
	return opts
}

func send(ctx context.Context, env *Env, method, path, auth, body string) (int, error) {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	st, err := env.Client.Do(ctx, method, env.API+path, auth, b)
	if err != nil && ctx.Err() == nil {
		env.rec.mu.Lock()
		env.rec.errors++
		env.rec.traceError(err)
		env.rec.mu.Unlock()
		// A limiter that gives up returns at once: do not spin.
		sleep(ctx, 10*time.Millisecond)
	}
	return st, err
}

// try sends a request that the limiter may refuse for a reason the caller
// expects (errors.Is(err, expected)): such a refusal is counted in the
// run's refusals, not its errors, and returned at once. Other errors are
// counted and paused on as by send.
func try(ctx context.Context, env *Env, method, path, auth, body string, expected error) error {
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	_, err := env.Client.Do(ctx, method, env.API+path, auth, b)
	switch {
	case err == nil || ctx.Err() != nil:
	case errors.Is(err, expected):
		env.rec.mu.Lock()
		env.rec.refused++
		env.rec.mu.Unlock()
	default:
		env.rec.mu.Lock()
		env.rec.errors++
		env.rec.traceError(err)
		env.rec.mu.Unlock()
		sleep(ctx, 10*time.Millisecond)
	}
	return err
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// windows is how many windows of length w start within d.
func windows(d, w time.Duration) float64 { return math.Ceil(float64(d) / float64(w)) }

// sliding is the most a leaky bucket of limit per w admits in d: a full
// burst, then the drain.
func sliding(limit int, w, d time.Duration) float64 {
	return float64(limit) + math.Floor(float64(limit)*float64(d)/float64(w))
}

func onBucket(hash string) func(discordtest.LogEntry) bool {
	return func(e discordtest.LogEntry) bool { return e.Bucket == hash }
}

// span adapts the most a limit allows in a duration to [Scenario].Max:
// from the first counted arrival to the end of the run.
func span(f func(d time.Duration) float64) func(first, end time.Duration) float64 {
	return func(first, end time.Duration) float64 { return f(end - first) }
}

// Scenarios returns the default suite for clients on network n: only the
// deadline scenario depends on it (see [DeadlineFor]).
func Scenarios(n discordtest.Network) []Scenario {
	deadline := DeadlineFor(n)
	const (
		satLimit, satWindow = 20, 500 * time.Millisecond
		fanChannels         = 200
		largeGlobal         = 500
		largeChannels       = 2000
	)
	return []Scenario{
		{
			Name:     "saturate",
			Emulator: base(bucket("sat", satLimit, satWindow, true, "POST /channels/{channel_id}/messages")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 50, func(ctx context.Context, g int) {
					send(ctx, env, "POST", "/channels/100/messages", Bot, `{"content":"hi"}`)
				})
			},
			Max:     span(func(d time.Duration) float64 { return satLimit * windows(d, satWindow) }),
			Counted: onBucket("sat"),
			Late:    fixedLate(satLimit, satWindow),
		},
		{
			Name:     "saturate-sliding",
			Emulator: base(bucket("sats", satLimit, satWindow, false, "POST /channels/{channel_id}/messages")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 50, func(ctx context.Context, g int) {
					send(ctx, env, "POST", "/channels/100/messages", Bot, `{"content":"hi"}`)
				})
			},
			Max:     span(func(d time.Duration) float64 { return sliding(satLimit, satWindow, d) }),
			Counted: onBucket("sats"),
		},
		{
			Name:     "fan-out",
			Emulator: base(bucket("fan", 5, time.Second, false, "POST /channels/{channel_id}/messages")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 100, func(ctx context.Context, g int) {
					for i := 0; ctx.Err() == nil; i++ {
						ch := 1000 + (g+i*100)%fanChannels
						send(ctx, env, "POST", fmt.Sprintf("/channels/%d/messages", ch), Bot, `{"content":"hi"}`)
					}
				})
			},
			Max:  span(func(d time.Duration) float64 { return globalPerSecond * windows(d, time.Second) }),
			Late: globalLate(globalPerSecond, time.Second),
		},
		{
			// A large bot: Discord raised its global limit to 500 per
			// second, and it posts to 2,000 channels (5 per 5 s each, 2,000
			// per second together), so the global limit binds.
			Name:        "large-bot",
			GlobalLimit: largeGlobal,
			Emulator:    base(bucket("large", 5, 5*time.Second, false, "POST /channels/{channel_id}/messages")...),
			Load: func(ctx context.Context, env *Env) {
				const goroutines = 1000
				env.Goroutines(ctx, goroutines, func(ctx context.Context, g int) {
					for i := 0; ctx.Err() == nil; i++ {
						ch := 100_000 + (g+i*goroutines)%largeChannels
						send(ctx, env, "POST", fmt.Sprintf("/channels/%d/messages", ch), Bot, `{"content":"hi"}`)
					}
				})
			},
			Max:  span(func(d time.Duration) float64 { return largeGlobal * windows(d, time.Second) }),
			Late: globalLate(largeGlobal, time.Second),
		},
		{
			Name: "shared-hash",
			Emulator: base(bucket("pair", 10, satWindow, true,
				"POST /channels/{channel_id}/messages", "PUT /channels/{channel_id}/pins/{message_id}")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 20, func(ctx context.Context, g int) {
					if g%2 == 0 {
						send(ctx, env, "POST", "/channels/200/messages", Bot, `{"content":"hi"}`)
					} else {
						send(ctx, env, "PUT", "/channels/200/pins/300", Bot, "")
					}
				})
			},
			Max:     span(func(d time.Duration) float64 { return 10 * windows(d, satWindow) }),
			Counted: onBucket("pair"),
			Late:    fixedLate(10, satWindow),
		},
		{
			Name: "shared-scope",
			Emulator: base(append(bucket("busy", 50, satWindow, true, "POST /channels/{channel_id}/messages"),
				discordtest.WithSharedLimit(discordtest.SharedLimit{Route: "POST /channels/{channel_id}/messages",
					Resource: "channels/500", Limit: 5, Window: time.Second, RetryAfter: 500 * time.Millisecond}))...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 10, func(ctx context.Context, g int) {
					send(ctx, env, "POST", "/channels/500/messages", Bot, `{"content":"hi"}`)
				})
			},
			Max:     span(func(d time.Duration) float64 { return 5 * windows(d, time.Second) }),
			Counted: onBucket("busy"),
		},
		{
			Name:     "bad-token",
			Emulator: base(bucket("me", 10, satWindow, true, "GET /users/@me")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 6, func(ctx context.Context, g int) {
					auth := Bot
					if g == 0 {
						auth = BadBot
					}
					send(ctx, env, "GET", "/users/@me", auth, "")
				})
			},
			Max:     span(func(d time.Duration) float64 { return 10 * windows(d, satWindow) }),
			Counted: onBucket("me"),
		},
		{
			Name:     "limit-lowered",
			Emulator: base(bucket("low", satLimit, satWindow, true, "POST /channels/{channel_id}/messages")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 50, func(ctx context.Context, g int) {
					send(ctx, env, "POST", "/channels/600/messages", Bot, `{"content":"hi"}`)
				})
			},
			Control: func(ctx context.Context, srv *discordtest.Server, d time.Duration) {
				sleep(ctx, d/2)
				if ctx.Err() == nil {
					srv.SetBucket(discordtest.Bucket{Hash: "low", Limit: 5, Window: satWindow, Fixed: true})
				}
			},
			// The limit falls at half the run, first being when the
			// first request counted.
			Max: func(first, d time.Duration) float64 {
				return satLimit*windows(max(0, d/2-first), satWindow) + 5*windows(d-d/2, satWindow)
			},
			Counted: onBucket("low"),
		},
		{
			Name: "webhooks",
			Emulator: base(append(bucket("fan", 5, time.Second, false, "POST /channels/{channel_id}/messages"),
				bucket("hook", 5, satWindow, true, "POST /webhooks/{webhook_id}/{webhook_token}")...)...),
			Load: func(ctx context.Context, env *Env) {
				go env.Goroutines(ctx, 100, func(ctx context.Context, g int) {
					for i := 0; ctx.Err() == nil; i++ {
						send(ctx, env, "POST", fmt.Sprintf("/channels/%d/messages", 1000+(g+i*100)%fanChannels), Bot, `{"content":"hi"}`)
					}
				})
				env.Goroutines(ctx, 8, func(ctx context.Context, g int) {
					h := hookOf(g, 4)
					send(ctx, env, "POST", fmt.Sprintf("/webhooks/%d/hook-token-%d", 700+h, h), "", `{"content":"hi"}`)
				})
			},
			// Webhooks have their own budget: 4 webhooks of 5 per 500 ms,
			// beside the bot's global 50 per second.
			Max: span(func(d time.Duration) float64 {
				return globalPerSecond*windows(d, time.Second) + 4*5*windows(d, satWindow)
			}),
		},
		interactive("interactive", true),
		interactive("interactive-fifo", false),
		// Callers that will not wait retry each refusal at once, on one hot bucket.
		hotRetry(),
		// One bot's mixed traffic under its global limit, with webhooks and a deleted one.
		mixed(),
		{
			Name:     "deadline",
			Emulator: base(bucket("slow", 1, 2*time.Second, true, "POST /channels/{channel_id}/messages")...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 20, func(ctx context.Context, g int) {
					dctx, cancel := context.WithTimeout(ctx, deadline)
					deadline, _ := dctx.Deadline()
					_, err := env.Client.Do(dctx, "POST", env.API+"/channels/800/messages", Bot, []byte(`{"content":"hi"}`))
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
			Max:      span(func(d time.Duration) float64 { return windows(d, 2*time.Second) }),
			Counted:  onBucket("slow"),
			Deadline: deadline,
		},
	}
}

// SetDefault, SetUnannounced and SetAll name sets of scenarios for
// -scenario: the default suite ([Scenarios]), the scenarios of limits no
// header announces ([Unannounced]), and both.
const (
	SetDefault     = "default"
	SetUnannounced = "unannounced"
	SetAll         = "all"
)

// Unannounced returns the scenarios of limits no header announces, which a
// client learns only from 429s: a limit of Discord's edge per client IP
// (edge-block), bucket headers that claim room the bucket does not have
// (understated, understated-bans) and the hidden sublimit on renaming a
// channel (sublimit), judged by whether the client repeats a 429 it was
// told about. They are kept out of the default suite until clients handle
// them; select them with -scenario unannounced or by name.
func Unannounced(n discordtest.Network) []Scenario {
	const (
		edgeLimit, edgeWindow = 20, time.Second
		perBot, botWindow     = 10, time.Second
		reactWindow           = 250 * time.Millisecond
		bansLimit, bansWindow = 2, time.Second
	)
	return []Scenario{
		{
			// Three bots behind one IP, each kept under its own bucket of
			// 10 per second, send 30 per second together past the edge
			// limit of 20: the edge blocks the IP (header-less 429s) for
			// 1.5 s, and bans it after more than 10 requests into blocks
			// within 1.5 s. With 6 goroutines, at most 6 requests are in
			// flight when a block starts, so a client that stops at the
			// first block response and then probes once a second is never
			// banned.
			Name: "edge-block",
			Emulator: base(append(bucket("edge", perBot, botWindow, false, "GET /channels/{channel_id}/messages"),
				discordtest.WithTokens(EdgeBots...),
				discordtest.WithEdgeLimit(discordtest.EdgeLimit{Route: "GET /channels/{channel_id}/messages",
					Limit: edgeLimit, Window: edgeWindow, Block: 1500 * time.Millisecond, BanAfter: 10}))...),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 2*len(EdgeBots), func(ctx context.Context, g int) {
					send(ctx, env, "GET", "/channels/100/messages", EdgeBots[g%len(EdgeBots)], "")
				})
			},
			Max:     span(func(d time.Duration) float64 { return edgeLimit * windows(d, edgeWindow) }),
			Counted: onBucket("edge"),
			// The first block pauses for seconds; what a client learned
			// from it shows after.
			MinDuration: edgeRun,
			// Six callers, however many workers: more would have more
			// than ten requests in flight into the first block.
			FixedLoad: true,
		},
		{
			// Reactions: the headers claim 200 with a ten-minute reset
			// (199 remaining) while the real limit is one per 250 ms.
			Name: "understated",
			Emulator: base(discordtest.WithBuckets(discordtest.Bucket{Hash: "react", Limit: 1, Window: reactWindow,
				Claim: discordtest.Claim{Limit: 200, Remaining: 199, ResetAfter: 10 * time.Minute}}),
				discordtest.WithRoutes(discordtest.Route{Template: "PUT /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me", Bucket: "react"})),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 4, func(ctx context.Context, g int) {
					send(ctx, env, "PUT", "/channels/100/messages/300/reactions/%F0%9F%91%8D/@me", Bot, "")
				})
			},
			Max:     span(func(d time.Duration) float64 { return sliding(1, reactWindow, d) }),
			Counted: onBucket("react"),
		},
		{
			// The guild bans list: every response says 5, 0 remaining and
			// a 60 s reset; the real limit is 2 per second.
			Name: "understated-bans",
			Emulator: base(discordtest.WithBuckets(discordtest.Bucket{Hash: "bans", Limit: bansLimit, Window: bansWindow, Fixed: true,
				Claim: discordtest.Claim{Limit: 5, Remaining: 0, ResetAfter: time.Minute}}),
				discordtest.WithRoutes(discordtest.Route{Template: "GET /guilds/{guild_id}/bans", Bucket: "bans"})),
			Load: func(ctx context.Context, env *Env) {
				env.Goroutines(ctx, 3, func(ctx context.Context, g int) {
					send(ctx, env, "GET", "/guilds/500/bans", Bot, "")
				})
			},
			Max:     span(func(d time.Duration) float64 { return bansLimit * windows(d, bansWindow) }),
			Counted: onBucket("bans"),
		},
		sublimit(),
	}
}

// sublimit renames one channel from 4 goroutines past the hidden sublimit
// of 2 per second, while another goroutine edits the same channel without
// renaming it (its position) every 100 ms: those edits share the bucket but
// not the sublimit, and the time each took is recorded as the scenario's
// wait (the urgent wait column). Renames are numbered as issued, to count
// those a limiter sends ahead of an earlier one still waiting.
func sublimit() Scenario {
	return Scenario{
		Name: "sublimit",
		Emulator: base(append(bucket("chan", 10, 500*time.Millisecond, true, "PATCH /channels/{channel_id}"),
			discordtest.WithHiddenSublimit(2, time.Second))...),
		Load: func(ctx context.Context, env *Env) {
			go env.Goroutines(ctx, 1, func(ctx context.Context, g int) {
				t0 := time.Now()
				if _, err := send(ctx, env, "PATCH", "/channels/400", Bot, `{"position":1}`); err == nil {
					env.Interactive(time.Since(t0))
				}
				sleep(ctx, 100*time.Millisecond)
			})
			env.Goroutines(ctx, 4, func(ctx context.Context, g int) {
				env.Rename(ctx, "/channels/400")
			})
		},
		Max:      span(func(d time.Duration) float64 { return 2 * windows(d, time.Second) }),
		Counted:  func(e discordtest.LogEntry) bool { return e.Bucket == "chan" && e.Renames },
		WaitNote: "non-rename edits of the renamed channel",
		Renames:  true,
	}
}

// hotRetry is one hot bucket of 5 per second (fixed window) whose 20
// callers will not wait: a request that would wait is refused at once
// (ratecord.WithRequestMaxWait of a millisecond) and tried again at once,
// with no pause but a yield. A limiter must keep the refusals from costing
// its store more than callers that wait would.
func hotRetry() Scenario {
	const limit, window = 5, time.Second
	return Scenario{
		Name:     "hot-retry",
		Emulator: base(bucket("hot", limit, window, true, "POST /channels/{channel_id}/messages")...),
		Load: func(ctx context.Context, env *Env) {
			env.Goroutines(ctx, 20, func(ctx context.Context, g int) {
				rctx := ratecord.WithRequestMaxWait(ctx, time.Millisecond)
				if try(rctx, env, "POST", "/channels/1300/messages", Bot, `{"content":"hi"}`, ratecord.ErrWaitTooLong) != nil {
					// Let the other goroutines run; nothing more.
					runtime.Gosched()
				}
			})
		},
		Max:     span(func(d time.Duration) float64 { return limit * windows(d, window) }),
		Counted: onBucket("hot"),
		Late:    fixedLate(limit, window),
	}
}

// hookOf returns the webhook, of hooks, that goroutine g of a webhook load
// sends to: two goroutines in a row share one. Goroutine g runs in process
// g mod procs, so each webhook has senders in two processes (with two or
// more), and a process that stops running (-freeze) leaves its webhooks to
// the other, as a bot's processes share its webhooks.
func hookOf(g, hooks int) int { return g / 2 % hooks }

// mixed is the traffic of one bot token, under its global limit of 50 per
// second: messages to 200 channels (5 per second each, 1,000 together, so
// the global limit binds), reactions on 3 messages (1 per 250 ms each),
// position edits of 2 channels (5 per second each, no rename, so no hidden
// sublimit), executions of 4 webhooks without a token (5 per 500 ms each,
// under the client IP's own global limit) and, every 250 ms, an execution
// of a webhook that was deleted, which answers 404 and which a limiter
// should then refuse at once (ratecord.ErrWebhookGone) rather than send.
// Every limit is announced by headers: the bot's global second plus the
// webhooks' windows bound the 2xx.
func mixed() Scenario {
	const (
		channels            = 200
		hooks, hookLimit    = 4, 5
		hookWindow          = 500 * time.Millisecond
		reactWindow         = 250 * time.Millisecond
		goneHook            = "2499"
		messages, reactions = 2000, 2300
	)
	return Scenario{
		Name: "mixed",
		Emulator: base(append(append(append(append(
			bucket("mmsg", 5, time.Second, false, "POST /channels/{channel_id}/messages"),
			bucket("mreact", 1, reactWindow, true, "PUT /channels/{channel_id}/messages/{message_id}/reactions/{emoji}/@me")...),
			bucket("medit", 5, time.Second, true, "PATCH /channels/{channel_id}")...),
			bucket("mhook", hookLimit, hookWindow, true, "POST /webhooks/{webhook_id}/{webhook_token}")...),
			discordtest.WithDeletedWebhooks(goneHook))...),
		Load: func(ctx context.Context, env *Env) {
			var wg sync.WaitGroup
			wg.Go(func() {
				env.Goroutines(ctx, 100, func(ctx context.Context, g int) {
					for i := 0; ctx.Err() == nil; i++ {
						ch := messages + (g+i*100)%channels
						send(ctx, env, "POST", fmt.Sprintf("/channels/%d/messages", ch), Bot, `{"content":"hi"}`)
					}
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 3, func(ctx context.Context, g int) {
					ch := strconv.Itoa(reactions + g%3)
					send(ctx, env, "PUT", "/channels/"+ch+"/messages/"+ch+"0/reactions/%F0%9F%91%8D/@me", Bot, "")
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 2, func(ctx context.Context, g int) {
					send(ctx, env, "PATCH", fmt.Sprintf("/channels/%d", 2400+g%2), Bot, `{"position":1}`)
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 8, func(ctx context.Context, g int) {
					h := hookOf(g, hooks)
					send(ctx, env, "POST", fmt.Sprintf("/webhooks/%d/hook-token-%d", 2450+h, h), "", `{"content":"hi"}`)
				})
			})
			wg.Go(func() {
				env.Goroutines(ctx, 1, func(ctx context.Context, g int) {
					try(ctx, env, "POST", "/webhooks/"+goneHook+"/gone-token", "", `{"content":"hi"}`, ratecord.ErrWebhookGone)
					sleep(ctx, 250*time.Millisecond)
				})
			})
			wg.Wait()
		},
		Max: span(func(d time.Duration) float64 {
			return globalPerSecond*windows(d, time.Second) + hooks*hookLimit*windows(d, hookWindow)
		}),
		Late: func(log []discordtest.LogEntry) []time.Duration {
			// The bot's requests: the webhooks' are limited per IP.
			var bot []discordtest.LogEntry
			for _, e := range log {
				if !strings.HasPrefix(e.Credential, "ip:") {
					bot = append(bot, e)
				}
			}
			return globalLate(globalPerSecond, time.Second)(bot)
		},
	}
}

// interactive is a bulk backlog on one channel (30 goroutines sending
// without pause to a bucket of 5 per second) with interactive traffic on
// the same bucket: one reply every 300 ms, marked urgent when lanes is
// true. It records how long each reply took, until the run's end for one
// still waiting.
func interactive(name string, lanes bool) Scenario {
	const limit, window = 5, time.Second
	return Scenario{
		Name:     name,
		Emulator: base(bucket("chat", limit, window, true, "POST /channels/{channel_id}/messages")...),
		Load: func(ctx context.Context, env *Env) {
			// Both groups, waited for: with processes, only the first runs
			// the interactive one, and the others must go on with the bulk.
			var wg sync.WaitGroup
			defer wg.Wait()
			wg.Go(func() {
				env.Goroutines(ctx, 30, func(ctx context.Context, g int) {
					send(ctx, env, "POST", "/channels/900/messages", Bot, `{"content":"bulk"}`)
				})
			})
			env.Goroutines(ctx, 1, func(ctx context.Context, g int) {
				rctx := ctx
				if lanes {
					rctx = ratecord.WithRequestPriority(ctx, ratecord.PriorityUrgent)
				}
				t0 := time.Now()
				send(rctx, env, "POST", "/channels/900/messages", Bot, `{"content":"reply"}`)
				env.Interactive(time.Since(t0))
				sleep(ctx, 300*time.Millisecond)
			})
		},
		Max:     span(func(d time.Duration) float64 { return limit * windows(d, window) }),
		Counted: onBucket("chat"),
	}
}

// fixedLate measures, for a fixed window of limit per w, how late the first
// request of each window arrived after the previous full window closed.
func fixedLate(limit int, w time.Duration) func([]discordtest.LogEntry) []time.Duration {
	return func(log []discordtest.LogEntry) []time.Duration {
		var late []time.Duration
		byMajor := map[string][]time.Time{}
		for _, e := range log {
			byMajor[e.Major] = append(byMajor[e.Major], e.Time)
		}
		for _, ts := range byMajor {
			sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
			start, n := time.Time{}, 0
			for _, t := range ts {
				if start.IsZero() || t.Sub(start) >= w {
					if n >= limit {
						late = append(late, t.Sub(start.Add(w)))
					}
					start, n = t, 0
				}
				n++
			}
		}
		return late
	}
}

// globalLate measures, for a sliding global window of limit per w, how late
// each request that waited for the window arrived after its slot opened.
func globalLate(limit int, w time.Duration) func([]discordtest.LogEntry) []time.Duration {
	return func(log []discordtest.LogEntry) []time.Duration {
		byCred := map[string][]time.Time{}
		for _, e := range log {
			byCred[e.Credential] = append(byCred[e.Credential], e.Time)
		}
		var late []time.Duration
		for _, ts := range byCred {
			sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) })
			for i := limit; i < len(ts); i++ {
				open := ts[i-limit].Add(w)
				if open.After(ts[i-1]) { // the request had to wait for this slot
					late = append(late, ts[i].Sub(open))
				}
			}
		}
		return late
	}
}
