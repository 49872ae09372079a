package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store/internal/model"
	"github.com/ratecord/ratecord/store/redisstore"
)

// The rate-limit model has two homes: store/internal/model in Go (memstore
// runs it) and model.lua (the Redis scripts run it). These tests run every
// transition in both and require the same state and the same decision
// after every step, so a rule changed in one home and not the other fails
// here.

// harness runs one model function of model.lua on a bucket given as
// arguments and returns the function's result and the bucket after it.
const harness = `
local st = {}
for i, f in ipairs(FIELDS) do
  local x = tonumber(ARGV[i + 1])
  if FLAGS[f] then st[f] = x == 1 else st[f] = x end
end
local n = #FIELDS + 1
local function a(i) return tonumber(ARGV[n + i]) end
local function hdr(i) return {limit = a(i), remaining = a(i + 1), resetAfter = a(i + 2), offset = a(i + 3), reset = a(i + 4)} end
local op, res = ARGV[1], 0
local function flag(x) if x then return 1 end return 0 end
if op == 'available' then res = flag(available(st, a(1)))
elseif op == 'take' then take(st, a(1), a(2))
elseif op == 'settle' then settle(st)
elseif op == 'unanswered' then unanswered(st, a(1))
elseif op == 'giveBack' then giveBack(st, a(1))
elseif op == 'observe' then observe(st, a(1), hdr(3), a(2))
elseif op == 'limited' then
  local h = nil
  if a(3) == 1 then h = hdr(4) end
  limited(st, a(1), a(2), h, a(9))
elseif op == 'shared' then shared(st, a(1), a(2))
elseif op == 'wakeAt' then res = wakeAt(st, a(1))
elseif op == 'bound' then res = bound(st, a(1), a(2))
elseif op == 'idle' then res = flag(idle(st, a(1)))
elseif op == 'seed' then seed(st, a(1))
elseif op == 'room' then res = room(st, a(1), a(2))
elseif op == 'takeN' then takeN(st, a(1), a(2), a(3))
end
local out = {string.format('%.17g', res)}
for i, f in ipairs(FIELDS) do
  local x = st[f]
  if FLAGS[f] then x = flag(x) end
  out[i + 1] = string.format('%.17g', x)
end
return out
`

var harnessScript = redis.NewScript(redisstore.ModelSource + harness)

// testReach is the reach the tests' grants are taken with: the default
// GlobalHold, in milliseconds.
const testReach = 250

// op is one model function with its arguments, as both homes take them.
type op struct {
	name string
	args []int64 // see harness
}

func (o op) String() string { return fmt.Sprintf("%s%v", o.name, o.args) }

func opAvailable(now int64) op     { return op{"available", []int64{now}} }
func opTake(now int64) op          { return op{"take", []int64{now, testReach}} }
func opSettle() op                 { return op{"settle", nil} }
func opGiveBack(now int64) op      { return op{"giveBack", []int64{now}} }
func opUnanswered(now int64) op    { return op{"unanswered", []int64{now}} }
func opWakeAt(now int64) op        { return op{"wakeAt", []int64{now}} }
func opBound(now, ahead int64) op  { return op{"bound", []int64{now, ahead}} }
func opIdle(now int64) op          { return op{"idle", []int64{now}} }
func opSeed(hold int64) op         { return op{"seed", []int64{hold}} }
func opRoom(now, most int64) op    { return op{"room", []int64{now, most}} }
func opTakeN(now, n int64) op      { return op{"takeN", []int64{now, n, testReach}} }
func opShared(now, retry int64) op { return op{"shared", []int64{now, retry}} }
func opObserve(now, probes int64, h model.Headers) op {
	return op{"observe", []int64{now, probes, h.Limit, h.Remaining, h.ResetAfter, h.Offset, h.Reset}}
}
func opLimited(now, retry int64, h *model.Headers, probes int64) op {
	if h == nil {
		return op{"limited", []int64{now, retry, 0, 0, 0, 0, 0, 0, probes}}
	}
	return op{"limited", []int64{now, retry, 1, h.Limit, h.Remaining, h.ResetAfter, h.Offset, h.Reset, probes}}
}

// apply runs o on the Go model and returns its result as the harness
// does (booleans as 0 and 1).
func (o op) apply(b *model.Bucket) float64 {
	a := o.args
	hdr := func(i int) model.Headers {
		return model.Headers{Limit: a[i], Remaining: a[i+1], ResetAfter: a[i+2], Offset: a[i+3], Reset: a[i+4]}
	}
	flag := func(x bool) float64 {
		if x {
			return 1
		}
		return 0
	}
	switch o.name {
	case "available":
		return flag(b.Available(a[0]))
	case "take":
		b.Take(a[0], a[1])
	case "settle":
		b.Settle()
	case "giveBack":
		b.GiveBack(a[0])
	case "unanswered":
		b.Unanswered(a[0])
	case "observe":
		b.Observe(a[0], hdr(2), a[1])
	case "limited":
		var h *model.Headers
		if a[2] == 1 {
			x := hdr(3)
			h = &x
		}
		b.Limited(a[0], a[1], h, a[8])
	case "shared":
		b.Shared(a[0], a[1])
	case "wakeAt":
		return float64(b.WakeAt(a[0]))
	case "bound":
		return float64(b.Bound(a[0], a[1]))
	case "idle":
		return flag(b.Idle(a[0]))
	case "seed":
		b.Seed(a[0])
	case "room":
		return float64(b.Room(a[0], a[1]))
	case "takeN":
		b.TakeN(a[0], a[1], a[2])
	default:
		panic("unknown op " + o.name)
	}
	return 0
}

// fields returns b in model.lua's FIELDS order (pendingUntil and
// lineUntil, fields of the Redis store only, as 0).
func fields(b *model.Bucket) []float64 {
	f := func(x bool) float64 {
		if x {
			return 1
		}
		return 0
	}
	return []float64{
		f(b.Known), float64(b.Limit), float64(b.Remaining), float64(b.ResetAt), f(b.Estimated),
		float64(b.Window), float64(b.Span), float64(b.Offset), float64(b.Pending), float64(b.Pause),
		f(b.Retired), f(b.Unlimited), f(b.Probe), f(b.Sliding), float64(b.Evidence), float64(b.Instant),
		float64(b.SeenAt), float64(b.SeenRemaining), b.Level, float64(b.LevelAt), float64(b.TauLo),
		float64(b.TauHi), 0, float64(b.Hold), float64(b.HoldLimit), float64(b.HeldAt), f(b.ServerInstant), 0,
		float64(b.Cap), float64(b.CapLimit), float64(b.CapAt), float64(b.Passed), float64(b.Carried), float64(b.Ended),
		float64(b.EndedInstant), float64(b.Aged), float64(b.ArriveBy),
	}
}

// runLua applies o to the bucket st (in FIELDS order) in model.lua and
// returns the result and the bucket after it.
func runLua(ctx context.Context, t *testing.T, c *redis.Client, st []float64, o op) (float64, []float64) {
	t.Helper()
	args := []any{o.name}
	for _, x := range st {
		args = append(args, strconv.FormatFloat(x, 'g', -1, 64))
	}
	for _, x := range o.args {
		args = append(args, x)
	}
	v, err := harnessScript.Run(ctx, c, nil, args...).StringSlice()
	if err != nil {
		t.Fatalf("model.lua %v: %v", o, err)
	}
	out := make([]float64, len(v))
	for i, s := range v {
		if out[i], err = strconv.ParseFloat(s, 64); err != nil {
			t.Fatalf("model.lua %v: reply %q: %v", o, v, err)
		}
	}
	return out[0], out[1:]
}

var fieldNames = []string{"known", "limit", "remaining", "resetAt", "estimated", "window", "span", "offset",
	"pending", "pause", "retired", "unlimited", "probe", "sliding", "evidence", "instant", "seenAt",
	"seenRemaining", "level", "levelAt", "tauLo", "tauHi", "pendingUntil", "hold", "holdLimit", "heldAt",
	"serverInstant", "lineUntil", "cap", "capLimit", "capAt", "passed", "carried", "ended", "endedInstant", "aged",
	"arriveBy"}

// step applies o in both homes, from the same state, and fails t when
// they disagree on the result or on any field. It returns the Go result.
func step(ctx context.Context, t *testing.T, c *redis.Client, b *model.Bucket, o op, trail []op) float64 {
	t.Helper()
	before := fields(b)
	got := o.apply(b)
	luaGot, luaState := runLua(ctx, t, c, before, o)
	after := fields(b)
	if got != luaGot && !(math.IsNaN(got) && math.IsNaN(luaGot)) {
		t.Fatalf("after %v: %v = %v in Go, %v in model.lua", trail, o, got, luaGot)
	}
	for i, x := range after {
		if luaState[i] != x {
			t.Fatalf("after %v: %v leaves %s = %v in Go, %v in model.lua", trail, o, fieldNames[i], x, luaState[i])
		}
	}
	return got
}

func modelClient(t *testing.T) *redis.Client {
	t.Helper()
	return newClient(t, redisAddr(t))
}

const t0 = 1_700_000_000_000 // a Redis time, in ms

// epoch is a moment on Discord's clock (X-RateLimit-Reset, in ms), which
// differs from the store's.
const epoch = 1_800_000_000_000

// TestModelTransitions is the table of the model's rules: each case builds
// a bucket through a sequence of transitions, checks the decisions the
// rule is about in Go, and requires model.lua to reach the same state and
// decisions at every step.
func TestModelTransitions(t *testing.T) {
	c := modelClient(t)
	h := func(limit, remaining, resetAfter int64) model.Headers {
		return model.Headers{Limit: limit, Remaining: remaining, ResetAfter: resetAfter, Offset: 10}
	}
	type check struct {
		at   int // after this many steps
		op   op
		want float64
	}
	cases := []struct {
		name   string
		start  model.Bucket
		steps  []op
		checks []check // decisions read without changing the bucket, in Go and Lua alike
	}{
		{
			name:  "probe: one request at a time until the limits are known",
			start: model.Bucket{Probe: true},
			steps: []op{opTake(t0), opObserve(t0+50, 0, h(5, 4, 1000)), opSettle()},
			checks: []check{
				{1, opAvailable(t0 + 1), 0},
				{3, opAvailable(t0 + 60), 1},
			},
		},
		{
			// The reach is 250 ms: the probe granted at t0 reaches Discord
			// by t0 + 250, and a running process reports its answer
			// within ReportSlack (250 ms) more.
			name:  "probe: an answer overdue (its process stopped) lets the next probe go",
			start: model.Bucket{Probe: true},
			// The stores settle a response's request before they observe
			// its headers.
			steps: []op{opTake(t0), opTake(t0 + 500), opSettle(), opObserve(t0+600, 0, h(5, 3, 1000)), opSettle()},
			checks: []check{
				{1, opAvailable(t0 + 499), 0},
				{1, opWakeAt(t0 + 100), t0 + 500}, // not 0: no need to wait for a response
				{1, opAvailable(t0 + 500), 1},
				{2, opAvailable(t0 + 600), 0}, // the second probe holds the next as the first did
				{2, opWakeAt(t0 + 600), t0 + 1000},
				{4, opRoom(t0+600, 10), 2}, // known: 3 left, less the probe still in flight
				{5, opRoom(t0+700, 10), 2},
			},
		},
		{
			name:  "fixed window: remaining counts grants; the refill keeps a slot for each request in flight",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(2, 1, 1000)), opTake(t0), opAvailable(t0),
				opTake(t0 + 1), // a grant Available refused is the caller's bug; the model still counts it
			},
			checks: []check{
				{1, opAvailable(t0), 1},
				{3, opRoom(t0+5000, 5), 1},       // reset passed: the request in flight keeps its slot
				{3, opWakeAt(t0 + 5), t0 + 1010}, // when the refill leaves one
			},
		},
		{
			name:  "fixed window: requests in flight at a dated reset carry over; a response of the ended window gives its slot back",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 4, 1000)), // the window ends at t0+1010
				opTakeN(t0+1, 2),
				opAvailable(t0 + 1010),                        // the reset: a new window, two requests still in flight
				opSettle(), opObserve(t0+1020, 0, h(5, 3, 0)), // one arrived in the ended window
				opTakeN(t0+1021, 4),
				opSettle(), opObserve(t0+1100, 0, h(5, 0, 990)), // the new window's count
				opSettle(), opObserve(t0+1150, 0, h(5, 1, 0)), // the other arrived in the ended window too
			},
			checks: []check{
				{2, opRoom(t0+1009, 10), 2},
				{2, opWakeAt(t0 + 5), 0},     // slots are left
				{3, opRoom(t0+1010, 10), 3},  // five, less the two in flight
				{5, opRoom(t0+1021, 10), 4},  // its slot came back
				{8, opRoom(t0+1101, 10), 0},  // the window's own response spoke
				{10, opRoom(t0+1151, 10), 0}, // which already left the slot out
				{10, opBound(t0+1151, 0), t0 + 2100},
			},
		},
		{
			name:  "fixed window: a response of the ended window read late is told by Discord's clock",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 5, Remaining: 4, ResetAfter: 1000, Offset: 10, Reset: epoch + 1000}),
				opTakeN(t0+1, 2),
				opAvailable(t0 + 1010), // a new window; two requests carried over
				opTakeN(t0+1011, 3),    // the rest of it: its end estimated at t0+2021
				// Its process stopped: the response is read 900 ms late, and
				// on the store's clock it looks a window later.
				opSettle(), opObserve(t0+1900, 0, model.Headers{Limit: 5, Remaining: 3, ResetAfter: 100, Offset: 10, Reset: epoch + 1000}),
			},
			checks: []check{
				{6, opRoom(t0+1901, 5), 1},          // its slot came back
				{6, opBound(t0+1901, 1), t0 + 2021}, // and the window's end stays the estimate
				{6, opRoom(t0+2021, 5), 1},          // which waits for the requests granted in it
			},
		},
		{
			name:  "fixed window: a response of a window before the limit fell, read late, does not raise it again",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 20, Remaining: 19, ResetAfter: 500, Offset: 10, Reset: epoch + 500}),
				opTakeN(t0+1, 5),
				opAvailable(t0 + 510), // a new window; five requests carried over
				opSettle(), opObserve(t0+600, 0, model.Headers{Limit: 5, Remaining: 0, ResetAfter: 400, Offset: 10, Reset: epoch + 1000}),
				// A process that stopped reads its response of the first
				// window, and its old limit, 700 ms late.
				opSettle(), opObserve(t0+1200, 0, model.Headers{Limit: 20, Remaining: 15, ResetAfter: 0, Offset: 10, Reset: epoch + 500}),
			},
			checks: []check{
				{5, opRoom(t0+1201, 30), 1}, // the lowered limit's next window, less the four in flight
				{7, opRoom(t0+1201, 30), 2}, // the same, less the three still in flight
			},
		},
		{
			name:  "fixed window: a response of the window the limit fell in, read after the 429 that named the lower limit, does not raise it",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(20, 19, 500)),
				opTakeN(t0+1, 19),
				// Discord lowered the limit to 5 while the requests were on
				// their way: a 429 comes back first.
				opSettle(), opLimited(t0+40, 460, &model.Headers{Limit: 5, Remaining: 0, ResetAfter: 450, Offset: 10}, 0),
				// A response Discord answered before the change, read after.
				opSettle(), opObserve(t0+50, 0, h(20, 4, 450)),
			},
			checks: []check{
				{4, opRoom(t0+600, 30), 0},       // five, less the 17 in flight
				{6, opRoom(t0+600, 30), 0},       // the same: not twenty
				{6, opBound(t0+51, 0), t0 + 510}, // the pause still holds
			},
		},
		{
			name:  "fixed window: of the responses of one window, the one with the shortest way down bounds its end",
			start: model.Bucket{},
			steps: []op{
				// Decided when the window began, 70 ms on the way down.
				opObserve(t0+70, 0, model.Headers{Limit: 3, Remaining: 2, ResetAfter: 500, Offset: 10, Reset: epoch + 500}),
				opTakeN(t0+71, 2),
				// Decided 65 ms later, 10 ms on the way down: the same end
				// on Discord's clock, 60 ms sooner on the store's.
				opSettle(), opObserve(t0+75, 0, model.Headers{Limit: 3, Remaining: 1, ResetAfter: 435, Offset: 10, Reset: epoch + 500}),
				// A slower one (Discord rounds its reset by a millisecond)
				// does not move the end later again.
				opSettle(), opObserve(t0+130, 0, model.Headers{Limit: 3, Remaining: 0, ResetAfter: 440, Offset: 10, Reset: epoch + 501}),
			},
			checks: []check{
				{1, opWakeAt(t0 + 71), 0},
				{4, opBound(t0+76, 2), t0 + 520},
				{6, opWakeAt(t0 + 131), t0 + 520},
				{6, opRoom(t0+519, 5), 0},
				{6, opRoom(t0+520, 5), 3},
			},
		},
		{
			name:  "fixed window: a closer bound does not shorten a pause, nor the window a request left unanswered may have opened",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0+70, 0, model.Headers{Limit: 2, Remaining: 1, ResetAfter: 500, Offset: 10, Reset: epoch + 500}),
				opShared(t0+72, 600),
				opObserve(t0+75, 0, model.Headers{Limit: 2, Remaining: 0, ResetAfter: 435, Offset: 10, Reset: epoch + 500}),
				opTake(t0 + 700),
				// Unanswered: Discord may have counted it in a window of
				// its own. A response of the old window read now bounds
				// the old window only.
				opUnanswered(t0 + 1300),
				opObserve(t0+1305, 0, model.Headers{Limit: 2, Remaining: 0, ResetAfter: 0, Offset: 10, Reset: epoch + 500}),
			},
			checks: []check{
				{3, opBound(t0+76, 0), t0 + 672},
				{3, opWakeAt(t0 + 76), t0 + 672},
				{3, opBound(t0+76, 3), t0 + 580 + 500}, // the end the pause overlaps stays
				{6, opWakeAt(t0 + 1306), t0 + 1300 + 10 + 510},
			},
		},
		{
			name:  "fixed window: a response read late, of a window before the one a later response dated, says nothing",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 20, Remaining: 19, ResetAfter: 500, Offset: 10, Reset: epoch + 500}),
				opTakeN(t0+1, 2),
				opSettle(), opObserve(t0+520, 0, model.Headers{Limit: 5, Remaining: 4, ResetAfter: 490, Offset: 10, Reset: epoch + 1010}),
				opSettle(), opObserve(t0+900, 0, model.Headers{Limit: 20, Remaining: 18, ResetAfter: 0, Offset: 10, Reset: epoch + 500}),
			},
			checks: []check{
				{4, opRoom(t0+521, 30), 3}, // the later window's four, less the request in flight
				{6, opRoom(t0+901, 30), 3}, // the first window's limit does not come back
			},
		},
		{
			name:  "fixed window: a response of the current window read late is not taken for a later window's",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 20, Remaining: 2, ResetAfter: 500, Offset: 10, Reset: epoch + 500}),
				opTakeN(t0+1, 2),
				// Decided before the first, read 400 ms late by a process
				// that stopped: on the store's clock its window ends 500 ms
				// later than the first's.
				opSettle(), opObserve(t0+400, 0, model.Headers{Limit: 20, Remaining: 5, ResetAfter: 600, Offset: 10, Reset: epoch + 500}),
			},
			checks: []check{
				{4, opRoom(t0+401, 30), 0},
				// The same window on Discord's clock: the first response
				// bounds its end closer, and stays.
				{4, opBound(t0+401, 0), t0 + 510},
			},
		},
		{
			name:  "fixed window: spent, with requests in flight, it wakes at its dated reset; an estimated window waits for them",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(2, 1, 1000)), opTake(t0 + 1),
				opAvailable(t0 + 1010), opSettle(), // answered late, in the new window's time
				opTakeN(t0+1011, 2), // a window no response dated: estimated
			},
			checks: []check{
				{2, opWakeAt(t0 + 5), t0 + 1010},
				{2, opRoom(t0+1010, 5), 1},
				{5, opWakeAt(t0 + 1100), 0},
				{5, opRoom(t0+5000, 5), 0},
			},
		},
		{
			name:  "fixed window: stale response does not raise remaining nor move reset earlier",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 1, 800)),
				opObserve(t0+10, 0, h(5, 3, 200)),
			},
			checks: []check{
				{2, opBound(t0+10, 1), t0 + 810},
				{2, opAvailable(t0 + 11), 1},
			},
		},
		{
			name:  "fixed window: a late request's response from the next window says what that window has left",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 1, 1000)),
				opTake(t0 + 990), opTake(t0 + 990), // the last slot, and one more in flight
				opSettle(),
				opObserve(t0+1050, 0, h(5, 4, 990)), // it arrived after Discord's reset and opened a window
			},
			checks: []check{
				{4, opRoom(t0+1051, 10), 4},                    // without the response: a new window, less the request in flight
				{5, opRoom(t0+1051, 10), 3},                    // four left there, one still in flight
				{5, opBound(t0+1051, 5), t0 + 1050 + 990 + 10}, // and the reset is that window's
			},
		},
		{
			name:  "fixed window: responses of one window jittered by the network keep the lowest count",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 2, 1000)),
				opObserve(t0+120, 0, h(5, 3, 950)), // arrived 70 ms late: its reset looks 70 ms later
			},
			checks: []check{
				{2, opRoom(t0+121, 10), 2},
			},
		},
		{
			name:  "limit raised mid-window adds the difference; lowered caps remaining",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 2, 1000)),
				opObserve(t0+10, 0, h(8, 7, 990)),
				opObserve(t0+20, 0, h(3, 2, 980)),
			},
		},
		{
			name:  "limit lowered while requests are in flight: they count against what is left",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 4, 1000)),
				opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1),
				opSettle(),
				opObserve(t0+20, 0, h(3, 1, 980)),
			},
			checks: []check{
				{6, opAvailable(t0 + 21), 0},
			},
		},
		{
			name:  "unknown reset-after assumes the longest window seen, at least a second",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, h(5, 0, -1))},
			checks: []check{
				{1, opWakeAt(t0 + 1), t0 + 1010},
			},
		},
		{
			name:  "sliding window detected from moving resets, then drips",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(10, 9, 100)),
				opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1),
				opObserve(t0+20, 0, h(10, 8, 200)),
				opObserve(t0+21, 0, h(10, 7, 300)),
				opObserve(t0+22, 0, h(10, 6, 400)),
			},
			checks: []check{
				{7, opIdle(t0 + 30), 0},
			},
		},
		{
			name:  "sliding bucket full: the next slot drips before the reset",
			start: model.Bucket{Known: true, Limit: 10, Remaining: 0, ResetAt: t0 + 1000, Window: 1000, Sliding: true, Level: 10, LevelAt: t0, TauLo: 100_000, TauHi: 100_000, Offset: 10},
			steps: []op{opWakeAt(t0)},
			checks: []check{
				{0, opAvailable(t0 + 50), 0},
				{0, opAvailable(t0 + 120), 1},
				{0, opWakeAt(t0), t0 + 110},
				{0, opBound(t0, 0), t0 + 110},
			},
		},
		{
			// The reach is 250 ms: a request granted at t0 reaches Discord
			// by t0 + 250, answered or not; a running process reports its
			// response within ReportSlack (250 ms) more.
			name:  "sliding: a request in flight counts a whole slot until it has surely arrived and gone unreported, then drains",
			start: model.Bucket{Known: true, Limit: 2, Remaining: 0, ResetAt: t0 + 200, Window: 200, Sliding: true, LevelAt: t0, TauLo: 100_000, TauHi: 100_000, Offset: 10},
			steps: []op{
				opTake(t0),
				opObserve(t0+600, 0, model.Headers{Limit: 2, Remaining: 1, ResetAfter: 100, Offset: 10}), opSettle(),
			},
			checks: []check{
				{0, opAvailable(t0), 1},
				{1, opAvailable(t0 + 300), 0},     // it may arrive as late as t0 + 250: its response is awaited
				{1, opAvailable(t0 + 499), 0},     // still
				{1, opWakeAt(t0 + 100), t0 + 500}, // then it ages, counted as arrived at t0 + 250
				{1, opAvailable(t0 + 500), 1},     // and has drained: a stopped process's request holds no slot longer
				{1, opBound(t0+500, 0), t0 + 500},
				{3, opAvailable(t0 + 600), 0}, // its response dates it again: a slot drains from there
				{3, opWakeAt(t0 + 600), t0 + 610},
			},
		},
		{
			name:  "sliding: an aged request drains from when it surely arrived",
			start: model.Bucket{Known: true, Limit: 2, Remaining: 0, ResetAt: t0 + 200, Window: 200, Sliding: true, LevelAt: t0, Level: 1, TauLo: 400_000, TauHi: 400_000, Offset: 10},
			steps: []op{opTake(t0)},
			checks: []check{
				// Until it ages, 0 + 1 in flight + the offset's 0.025 + 1 > 2.
				{1, opAvailable(t0 + 499), 0},
				{1, opWakeAt(t0 + 300), t0 + 500},
				// Then level 1 at t0, drained to 0.375 by t0 + 250, plus the
				// request there: 1.375, drained to 0.75 by t0 + 500, leaves a
				// slot. (Counted from t0 + 500 it would leave none.)
				{1, opAvailable(t0 + 500), 1},
			},
		},
		{
			name:  "sliding: a report settles an aged request first, never leaving one in flight uncounted",
			start: model.Bucket{Known: true, Limit: 3, Remaining: 0, ResetAt: t0 + 300, Window: 300, Sliding: true, LevelAt: t0, TauLo: 100_000, TauHi: 100_000},
			steps: []op{
				opTake(t0),       // arrives by t0 + 250
				opTake(t0 + 600), // aging the first on the way (drained by now); arrives by t0 + 850
				opSettle(),       // the first's report (or the second's: then the first counts twice a while)
				opSettle(),
			},
			checks: []check{
				{1, opRoom(t0+300, 5), 2},         // the first counts whole: level 0 + 1 in flight
				{2, opRoom(t0+600, 5), 2},         // the second counts whole, the first has drained
				{3, opRoom(t0+600, 5), 2},         // the second still counts whole
				{4, opRoom(t0+600, 5), 3},         // the second answered: its slot is free
				{2, opBound(t0+600, 0), t0 + 600}, // a slot free now
			},
		},
		{
			name: "sliding: responses compared on Discord's clock, which the network's jitter does not blur",
			// Both decided at once at Discord (server time 5e12), the fuller
			// one first; it arrives 100 ms sooner, so arrival plus
			// Reset-After puts both at t0+1000 and would look fixed.
			start: model.Bucket{Known: true, Limit: 10, Remaining: 0, ResetAt: t0, Window: 1000, Sliding: true, Evidence: 2, Offset: 10},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 10, Remaining: 0, ResetAfter: 1000, Offset: 10, Reset: 5e12 + 1000}),
				opObserve(t0+100, 0, model.Headers{Limit: 10, Remaining: 1, ResetAfter: 900, Offset: 10, Reset: 5e12 + 900}),
			},
			checks: []check{
				{2, opWakeAt(t0 + 101), t0 + 122}, // still sliding: the next slot drips
			},
		},
		{
			name:  "sliding: without Discord's clock the same responses look fixed",
			start: model.Bucket{Known: true, Limit: 10, Remaining: 0, ResetAt: t0, Window: 1000, Sliding: true, Evidence: 2, Offset: 10},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 10, Remaining: 0, ResetAfter: 1000, Offset: 10}),
				opObserve(t0+100, 0, model.Headers{Limit: 10, Remaining: 1, ResetAfter: 900, Offset: 10}),
			},
			checks: []check{
				{2, opWakeAt(t0 + 101), t0 + 1010}, // the reset
			},
		},
		{
			name:  "fixed bucket does not drip",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(10, 9, 1000)),
				opObserve(t0+5, 0, h(10, 8, 995)),
				opObserve(t0+6, 0, h(10, 7, 994)),
				opObserve(t0+7, 0, h(10, 0, 993)),
			},
			checks: []check{
				{4, opAvailable(t0 + 500), 0},
				{4, opWakeAt(t0 + 500), t0 + 1010},
			},
		},
		{
			name:  "user 429: pause, no slot until it ends, not sliding any more",
			start: model.Bucket{Known: true, Limit: 5, Remaining: 3, ResetAt: t0 + 100, Window: 1000, Sliding: true},
			steps: []op{opLimited(t0, 2010, nil, 0)},
			checks: []check{
				{1, opAvailable(t0 + 2000), 0},
				{1, opWakeAt(t0), t0 + 2010},
			},
		},
		{
			name:  "user 429 with headers observes them first",
			start: model.Bucket{},
			steps: []op{opLimited(t0, 310, &model.Headers{Limit: 1, Remaining: 0, ResetAfter: 234, Offset: 10}, 0)},
		},
		{
			name:  "shared 429 pauses but keeps the counts",
			start: model.Bucket{Known: true, Limit: 5, Remaining: 3, ResetAt: t0 + 100, Window: 1000},
			steps: []op{opShared(t0, 5000)},
			checks: []check{
				{1, opAvailable(t0 + 4999), 0},
				{1, opAvailable(t0 + 5000), 1},
			},
		},
		{
			name:  "probes in flight are discounted when a bucket is learned",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 2, h(5, 4, 1000))},
		},
		{
			name:  "a request never sent gives its slot back",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, h(2, 1, 1000)), opTake(t0 + 1), opGiveBack(t0 + 2)},
			checks: []check{
				{3, opAvailable(t0 + 2), 1},
			},
		},
		{
			name:  "a slot given back after its window ended does not count in the next",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, h(3, 2, 1000)), opTake(t0 + 1), opTake(t0 + 2), opGiveBack(t0 + 1500), opSettle()},
			checks: []check{
				{4, opRoom(t0+1500, 5), 2}, // a new window, less the request still in flight; no slot of the ended one
				{5, opRoom(t0+1501, 5), 3},
			},
		},
		{
			name:  "a request that got no answer after its window ended keeps the bucket closed a whole window after",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, h(2, 1, 1000)), opTake(t0 + 1), opUnanswered(t0 + 1500)},
			checks: []check{
				{3, opAvailable(t0 + 1100), 0},
				{3, opAvailable(t0 + 2519), 0},
				{3, opAvailable(t0 + 1500 + 10 + 1010), 1}, // the offset and the longest window (1010, its offset in it)
			},
		},
		{
			name:  "a request that got no answer while a dated window lasted counted in it: the window ends as dated",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, h(2, 1, 1000)), opTake(t0 + 1), opUnanswered(t0 + 500)},
			checks: []check{
				{3, opAvailable(t0 + 1009), 0},
				{3, opAvailable(t0 + 1010), 1},
			},
		},
		{
			name:  "a request that got no answer within a dated window's offset may have opened the next one",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, h(2, 1, 1000)), opTake(t0 + 1), opUnanswered(t0 + 1005)},
			checks: []check{
				{3, opAvailable(t0 + 1010), 0},
				{3, opAvailable(t0 + 2024), 0},
				{3, opAvailable(t0 + 1005 + 10 + 1010), 1},
			},
		},
		{
			name:  "queued claims wait whole windows behind the ones ahead",
			start: model.Bucket{Known: true, Limit: 2, Remaining: 0, ResetAt: t0 + 1000, Window: 1000, Span: 900},
			checks: []check{
				{0, opBound(t0, 0), t0 + 1000},
				{0, opBound(t0, 2), t0 + 1900},
				{0, opBound(t0, 5), t0 + 2800},
			},
		},
		{
			name: "a 429 while the headers said a slot remained, nothing passed in its window yet, holds the bucket to one at a time, apart by the time since the last response plus retry",
			// A window the last response (at t0) dated, none of whose
			// requests has been answered yet.
			start: model.Bucket{Known: true, Limit: 5, Remaining: 4, ResetAt: t0 + 110, Window: 110, Offset: 10, HeldAt: t0},
			steps: []op{
				opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 260, &model.Headers{Limit: 5, Remaining: 3, ResetAfter: 50, Offset: 10}, 0),
				opTake(t0 + 360), opSettle(),
				opObserve(t0+400, 0, h(5, 4, 100)),
			},
			checks: []check{
				{3, opAvailable(t0 + 359), 0},
				{3, opAvailable(t0 + 360), 1},
				{4, opAvailable(t0 + 361), 0}, // one in flight
				{4, opWakeAt(t0 + 361), 0},    // only its response opens it
				{6, opAvailable(t0 + 709), 0}, // a hold (50 + 260) after the last response
				{6, opAvailable(t0 + 710), 1},
				{6, opWakeAt(t0 + 401), t0 + 710},
				{6, opBound(t0+401, 2), t0 + 400 + 3*310},
				{6, opIdle(t0 + 709), 0},
				{6, opIdle(t0 + 5000), 1},
			},
		},
		{
			name:  "a 429 while the headers said slots remained, after one passed in its window: each window grants what passed, one more once a minute",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 4, 100)), opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 60, &model.Headers{Limit: 5, Remaining: 3, ResetAfter: 50, Offset: 10}, 0), // until the window's end
				opAvailable(t0 + 310), opTake(t0 + 310), // the window after the pause: one
				opSettle(), opObserve(t0+350, 0, h(5, 4, 100)),
				opAvailable(t0 + 460), opTake(t0 + 460), opSettle(), // each window: one
				opObserve(t0+60_100, 0, h(5, 4, 100)), opAvailable(t0 + 60_210), opTakeN(t0+60_210, 2), // a minute on: two
				opSettle(), opObserve(t0+60_250, 0, h(5, 4, 60)), opSettle(), opObserve(t0+60_260, 0, h(5, 3, 50)),
			},
			checks: []check{
				{4, opAvailable(t0 + 109), 0}, // the 429's pause
				{6, opAvailable(t0 + 311), 0}, // the cap is spent, though the headers claim 4
				{8, opAvailable(t0 + 351), 0},
				{11, opIdle(t0 + 100_000), 0},  // the cap is kept
				{11, opIdle(t0 + 700_000), 1},  // for ten minutes
				{12, opRoom(t0+60_210, 5), 2},  // one more than the cap once a minute
				{14, opRoom(t0+60_211, 5), 0},  // spent
				{18, opRoom(t0+60_400, 5), 2},  // the window passed two without a 429: the cap rises
				{18, opRoom(t0+130_000, 5), 3}, // and a minute on, one more again
			},
		},
		{
			name:  "a 429 after one passed whose wait outlasts its window shows a spacing longer than the window: a hold",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(5, 4, 100)), opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 260, &model.Headers{Limit: 5, Remaining: 3, ResetAfter: 50, Offset: 10}, 0),
			},
			checks: []check{
				{4, opAvailable(t0 + 359), 0}, // a hold (260 + 50) after the 429
				{4, opRoom(t0+360, 5), 1},     // one at a time
				{4, opBound(t0+360, 1), t0 + 50 + 2*310},
			},
		},
		{
			name:  "a 429 the headers announced (none remained) learns no hold",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(1, 1, 1000)), opTake(t0 + 1),
				opObserve(t0+40, 0, h(1, 0, 960)), opTake(t0 + 41),
				opLimited(t0+60, 1000, &model.Headers{Limit: 1, Remaining: 0, ResetAfter: 940, Offset: 10}, 0),
			},
			checks: []check{
				{5, opBound(t0+60, 0), t0 + 1060},
			},
		},
		{
			name:  "a 429 naming a lowered limit learns no hold: the new limit explains it",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(10, 9, 100)), opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 260, &model.Headers{Limit: 5, Remaining: 0, ResetAfter: 50, Offset: 10}, 0),
			},
			checks: []check{
				{4, opAvailable(t0 + 310), 1},
				{4, opBound(t0+50, 3), t0 + 310},
			},
		},
		{
			name:  "a 429 during an earlier 429's pause learns no hold: it echoes the first",
			start: model.Bucket{Known: true, Limit: 10, Remaining: 9, ResetAt: t0 + 110, Window: 110, Offset: 10, HeldAt: t0},
			steps: []op{
				opAvailable(t0), opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 100, &model.Headers{Limit: 10, Remaining: 3, ResetAfter: 50, Offset: 10}, 0), // a hold of 100 + 50
				opSettle(),
				opLimited(t0+70, 2000, &model.Headers{Limit: 10, Remaining: 3, ResetAfter: 50, Offset: 10}, 0),
				opSettle(),
				opObserve(t0+3000, 0, h(10, 9, 100)),
			},
			checks: []check{
				{10, opAvailable(t0 + 3149), 0},
				{10, opAvailable(t0 + 3150), 1},
			},
		},
		{
			name:  "a 429 whose own headers say none is left is the bucket's own: no hold",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(10, 9, 100)), opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 100, &model.Headers{Limit: 10, Remaining: 0, ResetAfter: 50, Offset: 10}, 0),
				opSettle(),
				opObserve(t0+3000, 0, h(10, 9, 100)),
			},
			checks: []check{
				{10, opAvailable(t0 + 3001), 1},
				{10, opTake(t0 + 3001), 0},
				{10, opAvailable(t0 + 3002), 1},
			},
		},
		{
			name:  "a 429 saying none is left in the fixed window of a response that said four were: the headers overstate, the bucket is held",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 5, Remaining: 4, ResetAfter: 1000, Offset: 10, Reset: epoch + 1000}),
				opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1),
				opLimited(t0+50, 950, &model.Headers{Limit: 5, Remaining: 0, ResetAfter: 950, Offset: 10, Reset: epoch + 1000}, 0),
				opSettle(), opSettle(), opSettle(), opSettle(),
				opAvailable(t0 + 1050), opTake(t0 + 1050),
			},
			checks: []check{
				{10, opAvailable(t0 + 1009), 0}, // the 429's pause and the window's reset
				{10, opRoom(t0+1010, 5), 1},     // the cap: one passed
				{12, opAvailable(t0 + 1051), 0}, // spent
			},
		},
		{
			name:  "a 429 saying none is left at another full-again moment (a sliding drip) learns no hold",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 5, Remaining: 4, ResetAfter: 1000, Offset: 10, Reset: epoch + 1000}),
				opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1),
				opLimited(t0+50, 950, &model.Headers{Limit: 5, Remaining: 0, ResetAfter: 990, Offset: 10, Reset: epoch + 1040}, 0),
				opSettle(), opSettle(), opSettle(), opSettle(),
				opAvailable(t0 + 1050), opTake(t0 + 1050),
			},
			checks: []check{
				{12, opAvailable(t0 + 1051), 1}, // no hold: more than one in flight
			},
		},
		{
			name:  "a 429 saying none is left while probes of unlearned routes were in flight learns no hold: they may have spent it",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, model.Headers{Limit: 5, Remaining: 4, ResetAfter: 1000, Offset: 10, Reset: epoch + 1000}),
				opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1), opTake(t0 + 1),
				opLimited(t0+50, 950, &model.Headers{Limit: 5, Remaining: 0, ResetAfter: 950, Offset: 10, Reset: epoch + 1000}, 1),
				opSettle(), opSettle(), opSettle(), opSettle(),
				opAvailable(t0 + 1050), opTake(t0 + 1050),
			},
			checks: []check{
				{12, opAvailable(t0 + 1051), 1},
			},
		},
		{
			name:  "a learned hold ends when a response names another limit",
			start: model.Bucket{Known: true, Limit: 5, Remaining: 4, ResetAt: t0 + 110, Window: 110, Offset: 10, HeldAt: t0},
			steps: []op{
				opAvailable(t0), opTake(t0 + 1), opSettle(),
				opLimited(t0+50, 500, &model.Headers{Limit: 5, Remaining: 3, ResetAfter: 50, Offset: 10}, 0),
				opTake(t0 + 600), opSettle(),
				opObserve(t0+650, 0, h(10, 9, 1000)),
				opTake(t0 + 651),
			},
			checks: []check{
				{6, opAvailable(t0 + 601), 0},
				{7, opAvailable(t0 + 651), 1},
				{8, opAvailable(t0 + 652), 1}, // two in flight again
			},
		},
		{
			name:  "a seeded hold spaces requests of headers describing a long window; a shorter seed leaves it",
			start: model.Bucket{},
			steps: []op{
				opObserve(t0, 0, h(10, 10, 2000)), opSeed(250),
				opTake(t0 + 250), opSettle(), opObserve(t0+300, 0, h(10, 9, 2000)),
				opSeed(100),
			},
			checks: []check{
				{2, opAvailable(t0 + 249), 0},
				{2, opAvailable(t0 + 250), 1},
				{3, opAvailable(t0 + 251), 0},
				{5, opAvailable(t0 + 549), 0},
				{6, opAvailable(t0 + 550), 1},
				{6, opWakeAt(t0 + 301), t0 + 550},
			},
		},
		{
			name:  "headers describing a window of a second or less are taken at their word: no seeded hold",
			start: model.Bucket{},
			steps: []op{
				opSeed(250), // not known yet: held
				opObserve(t0, 0, h(5, 4, 1000)),
				opSeed(250),
			},
			checks: []check{
				{1, opRoom(t0, 5), 1},
				{2, opRoom(t0, 5), 4}, // the headers' limit cleared the hold
				{3, opRoom(t0, 5), 4}, // and a window of a second keeps the seed away
			},
		},
		{
			name:  "a 429 far short of the end of a long window that passed several: a limit of a shorter period, held, not capped",
			start: model.Bucket{},
			steps: []op{
				// Reactions claiming 200 per ten minutes, at one per 250 ms.
				opObserve(t0, 0, h(200, 199, 600_000)), opTake(t0 + 1), opSettle(),
				opObserve(t0+60, 0, h(200, 199, 600_000)), opTake(t0 + 61), opSettle(),
				opLimited(t0+100, 250, &model.Headers{Limit: 200, Remaining: 199, ResetAfter: 600_000, Offset: 10}, 0),
				// Another request of the same burst: an echo of the first.
				opLimited(t0+110, 240, &model.Headers{Limit: 200, Remaining: 199, ResetAfter: 600_000, Offset: 10}, 0),
			},
			checks: []check{
				{7, opAvailable(t0 + 389), 0}, // a hold of 250 + 40 after the 429
				{7, opRoom(t0+390, 5), 1},     // one at a time
				{8, opRoom(t0+400, 5), 1},     // the hold after the echo
				{8, opRoom(t0+5000, 5), 1},    // and so on: the headers' window is not the limit
			},
		},
		{
			name:  "a credential's counter for routes without a bucket is never seeded",
			start: model.Bucket{Unlimited: true},
			steps: []op{opSeed(250), opTake(t0)},
			checks: []check{
				{2, opAvailable(t0), 1},
			},
		},
		{
			name:  "absurd durations are clamped",
			start: model.Bucket{},
			steps: []op{opObserve(t0, 0, model.Headers{Limit: 1, Remaining: 0, ResetAfter: 1 << 50, Offset: -5}), opShared(t0, 1<<52)},
		},
	}
	ctx := t.Context()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.start
			var trail []op
			checkAt := func(n int) {
				for _, ck := range tc.checks {
					if ck.at != n {
						continue
					}
					probe := b
					if got := step(ctx, t, c, &probe, ck.op, trail); got != ck.want {
						t.Errorf("after %v: %v = %v; want %v", trail, ck.op, got, ck.want)
					}
				}
			}
			checkAt(0)
			for i, o := range tc.steps {
				step(ctx, t, c, &b, o, trail)
				trail = append(trail, o)
				checkAt(i + 1)
			}
		})
	}
}

// TestModelDifferential drives both homes of the model with the same
// random transitions, clock steps and headers, and requires the same state
// and decisions after every step.
func TestModelDifferential(t *testing.T) {
	c := modelClient(t)
	ctx := t.Context()
	runs, steps := 200, 60
	if testing.Short() {
		runs = 40
	}
	for run := range runs {
		rng := rand.New(rand.NewPCG(uint64(run), 7))
		var b model.Bucket
		switch rng.IntN(3) {
		case 1:
			b.Probe = true
		case 2:
			b.Unlimited = rng.IntN(4) == 0
		}
		now := int64(t0)
		limit := int64(1 + rng.IntN(10))
		window := int64(50 + rng.IntN(2000))
		sliding := rng.IntN(2) == 0
		used := int64(0)                       // the emulated bucket's count, for plausible headers
		skew := int64(rng.IntN(20000)) - 10000 // Discord's clock against the store's
		reset := func(ra int64) int64 {
			if ra < 0 || rng.IntN(3) == 0 {
				return 0
			}
			return now + skew + ra - int64(rng.IntN(80)) // decided up to 80 ms before the arrival
		}
		var trail []op
		for range steps {
			now += int64(rng.IntN(3)) * int64(rng.IntN(int(window/2+1)))
			var o op
			switch r := rng.IntN(100); {
			case r < 18:
				o = opAvailable(now)
			case r < 25:
				o = opRoom(now, int64(1+rng.IntN(70)))
			case r < 45:
				o = opTake(now)
				used = min(used+1, limit)
			case r < 52:
				o = opSettle()
			case r < 55:
				o = opUnanswered(now)
			case r < 60:
				o = opGiveBack(now)
			case r < 80:
				remaining := max(0, limit-used-int64(rng.IntN(2)))
				ra := window - int64(rng.IntN(int(window)))
				if sliding {
					ra = (limit - remaining) * window / limit
				}
				if rng.IntN(10) == 0 {
					ra = -1
				}
				if rng.IntN(15) == 0 {
					limit = int64(1 + rng.IntN(10))
				}
				o = opObserve(now, int64(rng.IntN(3)), model.Headers{Limit: limit, Remaining: remaining, ResetAfter: ra, Offset: int64(rng.IntN(20)), Reset: reset(ra)})
				if rng.IntN(4) == 0 {
					used = 0
				}
			case r < 84:
				var hp *model.Headers
				if rng.IntN(2) == 0 {
					ra := int64(rng.IntN(int(window)))
					hp = &model.Headers{Limit: limit, Remaining: 0, ResetAfter: ra, Offset: 10, Reset: reset(ra)}
				}
				o = opLimited(now, int64(rng.IntN(3000)), hp, int64(rng.IntN(2)))
			case r < 86:
				o = opShared(now, int64(rng.IntN(5000)))
			case r < 92:
				o = opWakeAt(now)
			case r < 95:
				o = opBound(now, int64(rng.IntN(12)))
			case r < 97:
				o = opSeed(int64(rng.IntN(400)))
			case r < 98:
				o = opRoom(now, int64(rng.IntN(70)))
			case r < 99:
				o = opTakeN(now, int64(rng.IntN(4)))
				used = min(used+1, limit)
			default:
				o = opIdle(now)
			}
			step(ctx, t, c, &b, o, trail)
			trail = append(trail, o)
		}
	}
}

var sublimitScript = redis.NewScript(redisstore.ModelSource + `
local out = {}
for i = 1, #ARGV, 4 do
  local r = 0
  if hiddenSublimit(tonumber(ARGV[i]), tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]), tonumber(ARGV[i + 3])) then r = 1 end
  out[#out + 1] = r
end
return out
`)

// TestModelHiddenSublimit requires both homes to tell a hidden sublimit's
// 429 from its bucket's alike, on the edges and on random values.
func TestModelHiddenSublimit(t *testing.T) {
	c := modelClient(t)
	cases := [][4]int64{
		{600_010, 3000, 10, 0}, // a rename: minutes against seconds
		{310, 234, 10, 0},      // a bucket's own 429: retry_after a little past its reset
		{1250, 240, 10, 0},     // at the margin
		{1251, 240, 10, 0},     // past it
		{5000, -1, 10, 0},      // no reset: cannot tell
		{1 << 40, 0, -5, 0},    // clamped
		{310, 234, 10, 3},      // the bucket had room: not its 429
		{500, -1, 10, 1},       // the same without a reset
	}
	want := []int64{1, 0, 0, 1, 0, 1, 1, 1}
	rng := rand.New(rand.NewPCG(3, 11))
	for range 200 {
		cases = append(cases, [4]int64{int64(rng.IntN(20000)), int64(rng.IntN(12000)) - 1000, int64(rng.IntN(50)), int64(rng.IntN(3))})
	}
	var args []any
	for _, x := range cases {
		args = append(args, x[0], x[1], x[2], x[3])
	}
	got, err := sublimitScript.Run(t.Context(), c, nil, args...).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	for i, x := range cases {
		g := int64(0)
		if model.HiddenSublimit(x[0], x[1], x[2], x[3]) {
			g = 1
		}
		if got[i] != g {
			t.Errorf("HiddenSublimit(%v) = %d in Go, %d in model.lua", x, g, got[i])
		}
		if i < len(want) && g != want[i] {
			t.Errorf("HiddenSublimit(%v) = %d; want %d", x, g, want[i])
		}
	}
}
