// Package model holds ratecord's rate-limit rules: what a bucket, a route
// and a credential learn from responses and when they may grant a request.
//
// The rules are pure: no locks, no queues, no I/O, and time is an argument
// (milliseconds on the store's clock; the sliding-window model counts in
// microseconds). store/memstore is this model plus waiting; the Redis
// store's scripts (store/redisstore/model.lua) implement the same functions
// line by line, and a table of transition cases and a randomized
// differential test run both against each other, so a rule changed in one
// home and not the other fails a test.
package model

import (
	"math"
	"time"
)

// Bucket is one counter: a (credential, bucket hash, major parameter), the
// probe of a route whose bucket is not known yet, or a credential's counter
// for routes without one.
//
// Its fields are exported so that the stores can keep and compare it; only
// this package's functions change them.
type Bucket struct {
	// Known reports that Limit, Remaining and the window come from headers.
	Known     bool
	Limit     int64
	Remaining int64
	// ResetAt is when the current window ends (0: no window started).
	ResetAt int64
	// Estimated reports that ResetAt was guessed at a grant, not read from
	// a response; the next response replaces it.
	Estimated bool
	// Window is the longest window seen; Span the shortest (a lower bound
	// for estimates).
	Window int64
	Span   int64
	// Offset is the safety margin of the last update.
	Offset int64
	// Pending counts granted requests not reported yet.
	Pending int64
	// ArriveBy is when the requests in flight have reached Discord at the
	// latest: the last grant plus the store's reach (the policy's
	// GlobalHold: a grant lapses unsent at half of it), whether or not
	// their process, stopped or starved, reads their responses. Aged
	// counts the requests of Pending that the leaky-bucket model has
	// counted in Level already, as arrived at ArriveBy: left unreported
	// ReportSlack past it, when a running process would have reported
	// them, they drain from ArriveBy on instead of holding their slots
	// whole until reported. (A response read in time dates its request
	// more closely than ArriveBy does.) A report settles an aged request
	// first: if it was one granted since, the model counts one request
	// twice until the other reports, never one too few. In a bucket not
	// known yet, which has no level, an aged probe no longer holds back
	// the next one: its process stopped or died before it could report.
	Aged, ArriveBy int64
	// Carried counts the requests that were in flight when the fixed
	// window they were granted in ended, at Ended (on the store's clock):
	// each may still arrive at Discord in the window after it, which keeps
	// a slot for it. A response dated the ended window gives its slot
	// back. The window refills at its reset whether or not its requests
	// have answered (once a response dated it): a request whose response
	// is late, or a process stopped with requests in flight, holds one
	// slot each, not the bucket. EndedInstant is the ended window's end on
	// Discord's clock (X-RateLimit-Reset), 0 when unknown: a response read
	// late (its process stopped) looks a window later on the store's clock,
	// not on Discord's.
	Carried, Ended, EndedInstant int64
	// Pause holds every request until then (a 429).
	Pause int64
	// Retired marks the probe of a route that has learned its bucket.
	Retired bool
	// Unlimited marks a credential's counter for routes without a bucket:
	// only pauses apply.
	Unlimited bool
	// Probe marks the counter of a route whose bucket is not known yet.
	Probe bool

	// A sliding window (a leaky bucket) gives its slots back one at a
	// time. Headers do not say which kind a bucket is; it shows when the
	// moment the bucket will be full again moves later with each request
	// inside one window, which a fixed window never does.
	Sliding       bool
	Evidence      int64 // consecutive observations that looked sliding
	Instant       int64 // when the last response said the bucket would be full
	SeenAt        int64 // when that response arrived (0: none yet)
	SeenRemaining int64 // and the Remaining it gave
	// ServerInstant reports that Instant is on Discord's clock (from
	// X-RateLimit-Reset), which network latency does not blur; otherwise
	// it is the arrival plus Reset-After, on the store's clock. Instants
	// on different clocks are not compared.
	ServerInstant bool
	// Level is the leaky-bucket model's count at LevelAt of the requests
	// Discord has answered: it drains one slot per Tau. A request in
	// flight (Pending) counts as one whole slot on top of it until its
	// response dates it: Discord counts a request from when it arrives,
	// which may be as late as the response, so a slot that drained from
	// the grant would let network jitter bunch arrivals at Discord, or
	// until it has surely arrived (see Aged).
	Level   float64
	LevelAt int64
	// TauLo and TauHi bound the time one slot takes to drain, in
	// microseconds, from Reset-After = level * tau and
	// Remaining = floor(limit - level).
	TauLo, TauHi int64

	// Hold, when positive, holds the bucket to what Discord showed it
	// allows, whatever its headers say: one request in flight at a time,
	// and the next one no sooner than Hold after the last response
	// (HeldAt), so network jitter cannot bunch two requests at Discord.
	// It is learned from a 429 of a bucket whose headers said requests
	// remained, or seeded for routes whose headers are known to overstate
	// (see Seed). HoldLimit is the Limit it was made under: a response
	// naming another Limit clears it.
	Hold, HoldLimit, HeldAt int64

	// Cap, when positive, is the most requests a fixed window of the
	// bucket lets through although its headers claim CapLimit: what passed
	// (Passed, the responses other than 429 counted in the current window)
	// before a 429 of a window where the headers said requests remained
	// (see Limited). Each window then grants at most Cap, until a response
	// names another limit; once per CapProbe (from CapAt) a window grants
	// one more, and a window that passed more than Cap raises it.
	Cap, CapLimit, CapAt, Passed int64
}

// CapProbe is how often a capped bucket tries one request more than its
// cap in a window (see Bucket.Cap): at most one 429 per bucket per
// CapProbe while the cap holds. CapMemory is how long a cap is kept after
// it was learned or probed, the bucket idle.
const (
	CapProbe  = 60_000
	CapMemory = 600_000
)

// Headers is what a response said about its bucket. Times are in
// milliseconds.
type Headers struct {
	Limit, Remaining int64
	// ResetAfter is negative when the response gave no usable reset.
	ResetAfter int64
	// Offset is the safety margin added to resets.
	Offset int64
	// Reset is when the bucket is full again on Discord's clock, in
	// milliseconds since the Unix epoch (X-RateLimit-Reset), or 0 when
	// the response gave none. Clocks differ, so it is only compared with
	// other responses' Reset, never with the store's clock.
	Reset int64
}

// ResetMillis converts an X-RateLimit-Reset instant to [Headers].Reset:
// milliseconds since the Unix epoch, or 0 for none.
func ResetMillis(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return max(t.UnixMilli(), 0)
}

// slidingGuard keeps the comparison of two responses inside one window of
// a fixed bucket: a response that arrives within the last quarter of a
// window (and at least this close to the announced reset) may already
// belong to the next window, and is not compared.
const slidingGuard = 20

// Available reports whether b can grant a slot at now, refilling a fixed
// window whose reset has passed (see refillable).
func (b *Bucket) Available(now int64) bool {
	b.age(now)
	if now < b.Pause || b.Retired {
		return false
	}
	if b.Unlimited {
		return true
	}
	if b.Hold > 0 && (b.Pending > 0 || now < b.HeldAt+b.Hold) {
		return false
	}
	if !b.Known {
		// Probe: one request at a time until a response names the limits,
		// or until the probe's answer is overdue (aged: its process
		// stopped or died before it could report), when the next goes.
		return b.flying() == 0
	}
	if b.refillable(now) {
		b.Remaining = b.refill(now) - b.Pending
		b.Carried, b.Ended, b.EndedInstant = b.Pending, 0, 0
		if b.Pending > 0 {
			b.Ended = b.ResetAt
			if b.ServerInstant {
				b.EndedInstant = b.Instant
			}
		}
		b.ResetAt = 0
	}
	return b.Remaining > 0 || b.Sliding && b.dripFree(now)
}

// refillable reports whether b's fixed window has ended at now and a new
// one may start: its reset has passed, and a response dated it (an
// estimated reset, from a grant, waits for the requests in flight to
// answer: the first of them to arrive started the window at Discord,
// perhaps later than the estimate). The requests still in flight carry
// over into the new window (see Carried).
func (b *Bucket) refillable(now int64) bool {
	return !b.Sliding && b.ResetAt != 0 && now >= b.ResetAt && (b.Pending == 0 || !b.Estimated)
}

// refill returns the slots a new fixed window grants at now: the limit, or
// the cap a 429 showed (one more once per CapProbe), and starts counting
// the window's passes.
func (b *Bucket) refill(now int64) int64 {
	n := b.Limit
	if b.Cap > 0 {
		if b.Passed > b.Cap {
			b.Cap = min(b.Passed, b.Limit) // a window passed more without a 429
		}
		n = min(n, b.Cap)
		if n < b.Limit && now-b.CapAt >= CapProbe {
			n++
			b.CapAt = now
		}
	}
	b.Passed = 0
	return n
}

// perWindow is how many requests a fixed window of b grants: its limit,
// or its cap.
func (b *Bucket) perWindow() int64 {
	if b.Cap > 0 {
		return max(min(b.Limit, b.Cap), 1)
	}
	return b.Limit
}

// Tau is how long the model takes to give one slot back, in microseconds:
// an upper bound of the real time, so the model never drains too fast.
func (b *Bucket) Tau() int64 {
	if b.TauHi > 0 {
		return b.TauHi
	}
	return b.Window * 1000 / max(b.Limit, 1)
}

// levelNow returns the model's level at now: what was counted, less what
// has drained since.
func (b *Bucket) levelNow(now int64) float64 {
	tau := b.Tau()
	if tau <= 0 || b.LevelAt == 0 {
		return b.Level
	}
	return max(0, b.Level-float64((now-b.LevelAt)*1000)/float64(tau))
}

// age counts the requests in flight left unreported ReportSlack past
// ArriveBy in the leaky-bucket level, as arrived at ArriveBy (see Aged).
// Added at ArriveBy, they drain from then; added to a level that a later
// response set, they drain with it, from then (a bucket that was draining
// other requests meanwhile may not have drained them yet).
func (b *Bucket) age(now int64) {
	n := b.flying()
	if n <= 0 || b.ArriveBy == 0 || now < b.ArriveBy+ReportSlack || b.Unlimited {
		return
	}
	// A bucket not known yet has no level: its probe, aged, no longer
	// holds the next one back (see Available).
	if b.Known {
		if b.ArriveBy >= b.LevelAt {
			b.Level = b.levelNow(b.ArriveBy) + float64(n)
			b.LevelAt = b.ArriveBy
		} else {
			b.Level += float64(n)
		}
	}
	b.Aged = b.Pending
}

// ReportSlack is how long after its requests in flight have surely
// reached Discord (ArriveBy) a bucket waits for their responses before it
// ages them (see Aged): longer than a running process takes to read and
// report a response.
const ReportSlack = 250

// flying is how many requests in flight the leaky-bucket model counts
// whole on top of its level: those not aged (see Aged).
func (b *Bucket) flying() int64 { return b.Pending - b.Aged }

// dripFree reports whether the leaky-bucket model has a slot at now, one
// offset's worth of drain to spare, the requests in flight not aged
// counted whole.
func (b *Bucket) dripFree(now int64) bool {
	tau := b.Tau()
	return tau > 0 && b.levelNow(now)+float64(b.flying())+float64(b.Offset*1000)/float64(tau)+1 <= float64(b.Limit)
}

// dripAt returns when the model next has a slot (milliseconds) by the
// drain alone, and false when the requests in flight fill the bucket
// whatever drains: then only a response can open it, and the time
// returned is when the drain is complete.
func (b *Bucket) dripAt() (int64, bool) {
	tau := b.Tau()
	room := float64(b.Limit) - 1 - float64(b.Offset*1000)/float64(tau) - float64(b.flying())
	ok := room >= 0
	excess := b.Level - room
	if !ok {
		excess = b.Level
	}
	// The explicit conversion rounds the product, as the scripts do: no
	// fused multiply-add.
	return b.LevelAt + int64(math.Ceil(float64(max(excess, 0)*float64(tau))/1000)), ok
}

// WakeAt returns when b may become available by the passing of time alone,
// or 0 when only a response can open it.
func (b *Bucket) WakeAt(now int64) int64 {
	b.age(now)
	at := b.Pause
	if at > now {
		return at
	}
	if b.Hold > 0 && !b.Unlimited {
		if b.Pending > 0 {
			return 0
		}
		if at := b.HeldAt + b.Hold; at > now {
			return at
		}
	}
	if !b.Known && !b.Unlimited && b.flying() > 0 && b.ArriveBy > 0 {
		return b.ArriveBy + ReportSlack // the probe ages then
	}
	if b.Known && b.Remaining <= 0 && b.Sliding {
		// No refill at the reset: slots come back by the drip, or by a
		// response when the requests in flight fill the bucket.
		if at, ok := b.dripAt(); ok {
			return max(at, now+1)
		}
		if b.flying() > 0 && b.ArriveBy > 0 {
			return b.ArriveBy + ReportSlack // the requests in flight age then
		}
		return 0
	}
	if b.Known && b.Remaining <= 0 && b.ResetAt > now && (b.Pending == 0 || !b.Estimated && b.perWindow() > b.Pending) {
		// The refill leaves a slot beyond the requests it carries over.
		return b.ResetAt
	}
	return 0
}

// Take grants one slot at now; Available must have said yes. reach is
// the longest, in milliseconds, that its request may take to reach
// Discord from now (the policy's GlobalHold; see Aged).
func (b *Bucket) Take(now, reach int64) { b.TakeN(now, 1, reach) }

// TakeN grants n slots at now, as n calls of Take would; Room must have
// said there are that many.
func (b *Bucket) TakeN(now, n, reach int64) {
	if n <= 0 {
		return
	}
	b.age(now)
	b.Pending += n
	b.ArriveBy = max(b.ArriveBy, now+max(reach, 0))
	if b.Hold > 0 {
		b.HeldAt = max(b.HeldAt, now)
	}
	if !b.Known || b.Unlimited {
		return
	}
	b.Remaining -= n
	if b.ResetAt == 0 {
		b.ResetAt = now + b.Window
		b.Estimated = true
	}
}

// Room returns how many slots b can grant at now one after the other, at
// most most: how many times Available would say yes with a Take after
// each. Like Available, it refills a fixed window whose reset has passed.
// It is what a store needs to
// grant a batch of waiters, or to tell how many slots a line keeps, in
// one step.
func (b *Bucket) Room(now, most int64) int64 {
	if most <= 0 || !b.Available(now) {
		return 0
	}
	switch {
	case b.Unlimited:
		return most
	case b.Hold > 0 || !b.Known:
		// One at a time: a Take puts one in flight, which closes it.
		return 1
	}
	n := max(b.Remaining, 0)
	if b.Sliding {
		n = max(n, b.dripRoom(now, most))
	}
	return min(max(n, 1), most)
}

// dripRoom returns how many more requests in flight the leaky-bucket
// model admits at now (dripFree with j more in flight, for j = 0, 1, ...),
// at most most. The estimate from the free level is checked with the same
// arithmetic as dripFree, so the answer is exactly the count of a loop.
func (b *Bucket) dripRoom(now, most int64) int64 {
	tau := b.Tau()
	if tau <= 0 {
		return 0
	}
	lvl := b.levelNow(now)
	off := float64(b.Offset*1000) / float64(tau)
	flying := b.flying()
	admits := func(j int64) bool {
		return lvl+float64(flying+j)+off+1 <= float64(b.Limit)
	}
	free := math.Floor(float64(b.Limit) - lvl - float64(flying) - off)
	n := int64(0)
	if free > 0 {
		n = int64(min(free, float64(most)))
	}
	for n > 0 && !admits(n-1) {
		n--
	}
	for n < most && admits(n) {
		n++
	}
	return n
}

// Settle counts a granted request as answered, an aged one first (see
// Aged).
func (b *Bucket) Settle() {
	if b.Pending > 0 {
		b.Pending--
	}
	if b.Aged > 0 {
		b.Aged--
	}
}

// Unanswered settles a request that was sent at or before now but got no
// response: it failed in flight, or its caller gave up. Discord may have
// counted it when it arrived, as late as now: the leaky-bucket model
// counts it from now. A known fixed window that a response dated and that
// lasts past now (its offset aside) held the request's arrival: it counted
// there, and the window ends as that response said. Otherwise the request
// may have opened the first window no response dated, which does not
// reopen before now, plus the offset and the window's longest length.
func (b *Bucket) Unanswered(now int64) {
	b.Settle()
	b.HeldAt = max(b.HeldAt, now)
	if !b.Known || b.Unlimited {
		return
	}
	b.Level = b.levelNow(now) + 1
	b.LevelAt = now
	if b.Sliding || !b.Estimated && b.ResetAt-b.Offset > now {
		return
	}
	b.ResetAt = max(b.ResetAt, now+b.Offset+b.Window)
}

// GiveBack returns, at now, the slot of a granted request that was never
// sent. A fixed window whose reset has passed gets nothing back: the slot
// was of that window, which has ended at Discord, and counted in the next
// one it could let one more through than that window allows. (Once the
// next window has started, the slot it kept for the request, which was in
// flight when it started, comes back.)
func (b *Bucket) GiveBack(now int64) {
	b.Settle()
	if b.Known && b.Remaining < b.Limit && (b.Sliding || b.ResetAt == 0 || now < b.ResetAt) {
		b.Remaining++
	}
}

// Observe applies rate-limit headers received at now. Within a window the
// remaining count only goes down and the reset only moves later, so a stale
// or reordered response never reopens a window early. probes is the number
// of requests in flight on routes of the same major parameter whose bucket
// is not known yet: Discord may have counted them in this bucket.
func (b *Bucket) Observe(now int64, h Headers, probes int64) {
	b.age(now)
	limit, remaining := h.Limit, h.Remaining
	after := h.ResetAfter
	if after < 0 {
		after = max(b.Window, 1000)
	}
	reset := now + clamp(after) + clamp(h.Offset)
	b.HeldAt = max(b.HeldAt, now)
	if older, ended := b.older(h, reset); older {
		// A response of a window that has ended says nothing of the
		// current one: not its count, nor its limit (it may predate a
		// change), however late it is read. If its request was carried
		// over, it arrived in the window that ended: the slot the current
		// window kept for it is free, unless a response of the current
		// window has spoken for the count since (its Remaining may
		// already leave that slot out).
		if ended && b.Carried > 0 {
			b.Carried--
			if b.ResetAt == 0 || b.Estimated {
				b.Remaining++
			}
		}
		return
	}
	if b.Known && limit > b.Limit && now < b.Pause {
		// A higher limit while a 429 holds the bucket: a response that
		// Discord answered before it lowered the limit, read after the
		// 429 that named the lower one (responses come back in any
		// order). A limit raised indeed shows in the responses after the
		// pause.
		return
	}
	if b.Hold > 0 && limit != b.HoldLimit {
		b.Hold, b.HoldLimit = 0, 0 // the headers changed: what the hold was learned under is gone
	}
	if b.Cap > 0 && limit != b.CapLimit {
		b.Cap, b.CapLimit, b.CapAt = 0, 0, 0 // likewise for a cap
	}
	if limit > 0 && remaining == limit-1 && h.ResetAfter > 0 && (b.Span == 0 || h.ResetAfter < b.Span) {
		b.Span = h.ResetAfter
	}
	b.Offset = clamp(h.Offset)
	// The window the model counts, on Discord's clock (see windowOf).
	counted := int64(0)
	if b.ServerInstant {
		counted = b.Instant
	}
	if h.ResetAfter >= 0 {
		b.watchSliding(now, h, limit, remaining)
	}
	if b.Known && limit != b.Limit {
		b.TauLo, b.TauHi = 0, 0 // the drain time changes with the limit
	}
	used := limit - remaining // the level is in (used-1, used]
	if h.ResetAfter >= 0 && limit > 0 {
		ra := clamp(h.ResetAfter) * 1000
		if used >= 1 {
			if lo := ra / used; lo > b.TauLo {
				b.TauLo = lo
			}
		}
		if used >= 2 {
			if hi := ceilDiv(ra, used-1); b.TauHi == 0 || hi < b.TauHi {
				b.TauHi = hi
			}
		}
	}
	// The level the response reports: Reset-After divided by the shortest
	// drain time it can be, or failing that the count Remaining implies.
	// Requests in flight are in the model already (each grant added one).
	// The model never forgets a request faster than the bucket drains: a
	// reordered response showing a lower level does not lower it.
	reported := float64(used)
	if h.ResetAfter >= 0 && b.TauLo > 0 {
		reported = max(reported-1, float64(clamp(h.ResetAfter)*1000)/float64(b.TauLo))
	}
	b.Level = max(b.levelNow(now), reported)
	b.LevelAt = now
	if !b.Known {
		b.Known = true
		b.Limit = limit
		b.Remaining = remaining
		if !b.Probe {
			// Requests in flight on routes not learned yet may share this
			// bucket: Discord has counted them, this response may not.
			b.Remaining = max(0, remaining-probes)
		} else {
			// So may the probes still in flight (one that went when
			// another's answer was overdue).
			b.Remaining = max(0, remaining-b.Pending)
		}
		b.ResetAt = reset
		b.Window = reset - now
		b.Passed = 1
		// Probes aged while the bucket was not known are in no level:
		// from now on they count whole, and age as requests of a known
		// bucket do.
		b.Aged = 0
	} else {
		// A fixed window's response dated a window after the one the
		// model counts belongs to a new window at Discord, which one of
		// the model's last requests opened on arriving late: it says
		// what that window has left, less the requests still in flight,
		// which may count in it too. One dated a window before says
		// nothing of the current one.
		later, earlier := b.windowOf(h, reset, counted)
		if limit > b.Limit {
			b.Remaining += limit - b.Limit
		}
		if limit < b.Limit || later {
			// A lowered limit, or a new window: the requests still in
			// flight were granted before and may not be counted in this
			// response.
			remaining -= b.Pending
		}
		b.Limit = limit
		if later || remaining < b.Remaining && !earlier {
			b.Remaining = remaining
		}
		if later {
			b.Passed = 0
			if b.Cap > 0 {
				// What the cap leaves of the new window: the requests it
				// counted, and those still in flight, spend it too.
				b.Remaining = min(b.Remaining, b.Cap-(limit-h.Remaining)-b.Pending)
			}
		}
		b.Passed++
		same := b.sameWindow(h, counted)
		switch {
		case b.Estimated || b.ResetAt == 0 || reset > b.ResetAt && !same:
			b.ResetAt = reset
			b.Estimated = false
		case same && reset < b.ResetAt && b.ResetAt-reset < max(b.Window/2, slidingGuard) && reset >= b.Pause:
			// Each response of a window bounds its end from above: it
			// ends Reset-After after Discord answered, no later than the
			// arrival. The response that took the shortest way down
			// bounds it closest. (An end moved further by a pause, or by
			// a request that may have opened the next window, stays.)
			b.ResetAt = reset
		}
		if w := reset - now; w > b.Window {
			b.Window = w
		}
	}
}

// older reports whether headers h of a known fixed window, whose window
// ends at reset, date from a window that ended before the one b counts:
// ended, the window that ended while requests were in flight (see
// Carried); or, on Discord's clock, a window half a window or more before
// the last response's. Windows end at least a window apart. Discord's
// clock (X-RateLimit-Reset) decides where h and the window it is compared
// with have an instant on it: a response read late (its process stopped)
// looks a window later on the store's clock, not on Discord's. On the
// store's clock a response naming another limit is never of the ended
// window.
func (b *Bucket) older(h Headers, reset int64) (older, ended bool) {
	if !b.Known || b.Sliding || h.ResetAfter < 0 {
		return false, false
	}
	gap := max(b.Window/2, slidingGuard)
	if b.Ended != 0 {
		if h.Reset > 0 && b.EndedInstant > 0 {
			ended = h.Reset < b.EndedInstant+gap
		} else {
			ended = h.Limit == b.Limit && reset < b.Ended+gap
		}
	}
	return ended || h.Reset > 0 && b.ServerInstant && b.Instant > 0 && h.Reset < b.Instant-gap, ended
}

// windowOf reports whether headers h of a known fixed window, whose
// window ends at reset, date from a later window than the one b counts
// (its end at least half a window after b's) or an earlier one.
// Responses of one window end within the network's jitter of each other.
// Discord's clock decides when h and the window b counts (counted, the
// last response's X-RateLimit-Reset, 0 when unknown) are both on it: on
// the store's clock a response read late, by a process that stopped
// running, would look a window later and raise the count.
func (b *Bucket) windowOf(h Headers, reset, counted int64) (later, earlier bool) {
	if !b.Known || b.Sliding || b.Estimated || b.ResetAt == 0 || h.ResetAfter < 0 {
		return false, false
	}
	gap := max(b.Window/2, slidingGuard)
	if h.Reset > 0 && counted > 0 {
		return h.Reset > counted+gap, h.Reset < counted-gap
	}
	return reset > b.ResetAt+gap, reset < b.ResetAt-gap
}

// watchSliding compares a response with the previous one. Inside one
// window, a fixed bucket's full-again moment stays put whatever the count,
// while a sliding bucket's moves by window/limit per request counted
// between the two responses (later for more used, earlier for fewer: the
// comparison does not depend on the order responses arrive in). Two such
// moves in a row make the bucket sliding; a count that changes while the
// moment stays put makes it fixed again.
//
// The moments are read on Discord's clock (X-RateLimit-Reset, and the
// decision at Reset less Reset-After) when both responses give it: the
// arrival plus Reset-After moves with the network's jitter, which at
// Discord's latency is longer than a slot of a busy bucket and made
// sliding buckets look fixed.
func (b *Bucket) watchSliding(now int64, h Headers, limit, remaining int64) {
	decided, instant, server := now, now+h.ResetAfter, false
	if h.Reset > 0 && h.Reset-h.ResetAfter > 0 {
		decided, instant, server = h.Reset-h.ResetAfter, h.Reset, true
	}
	prev, prevSeen, prevRemaining, prevServer := b.Instant, b.SeenAt, b.SeenRemaining, b.ServerInstant
	b.Instant, b.SeenAt, b.SeenRemaining, b.ServerInstant = instant, now, remaining, server
	if prevSeen == 0 || server != prevServer || limit <= 0 || decided >= prev-max(slidingGuard, b.Window/4) {
		return // no previous response in this window, or on another clock
	}
	k := prevRemaining - remaining // requests counted between the two
	if k == 0 {
		return
	}
	d := instant - prev
	if k < 0 {
		k, d = -k, -d
	}
	tau := b.Window * 1000 / max(limit, 1) // microseconds
	switch {
	case d*1000 > k*max(tau/2, 2000):
		b.Evidence++
		if b.Evidence >= 2 {
			b.Sliding = true
		}
	case d < 5 && d > -5:
		b.Evidence = 0
		b.Sliding = false
		b.TauLo, b.TauHi = 0, 0
	}
}

// Limited applies a 429 of scope user (or an unknown scope) received at
// now: the bucket pauses for retry (offset included) and its window is
// taken as spent until then. A 429 the headers did not announce also means
// the bucket is not the smooth sliding window it looked like.
//
// When the model still counted the request inside what the last headers
// allowed (a slot remained and the window they dated was not over), the
// 429's own headers still claim room, or say none is left in the same
// fixed window as a response that said some was (see sameFixedWindow;
// otherwise a 429 saying none is left is the bucket's own, which a sliding
// window's drip can bring a little early at network latency), the 429
// names no other limit (a lowered limit explains it) and no earlier
// 429's pause lasts (this one would only echo it, for a request sent
// before), the headers overstate the bucket: it is held (see Hold) to one request at a
// time until a response names another Limit. The spacing is what the 429
// shows of the real one: the time since the previous response (no later
// than the previous accepted request reached Discord; at most a window)
// plus retry. Measured from each response, it leaves a round trip more
// between two arrivals at Discord, so jitter cannot bunch them.
func (b *Bucket) Limited(now, retry int64, h *Headers, probes int64) {
	contradicted := b.Known && !b.Unlimited && !b.Estimated && b.Remaining >= 0 && now < b.ResetAt &&
		(h == nil || h.Limit == b.Limit && (h.Remaining > 0 || b.sameFixedWindow(*h, probes))) && now >= b.Pause
	since := min(max(now-b.HeldAt, 0), b.Window)
	sliding, left := b.Sliding, b.ResetAt-now
	if h != nil {
		b.Observe(now, *h, probes)
		b.Passed-- // a 429 did not pass
	}
	b.Pause = max(b.Pause, now+clamp(retry))
	b.HeldAt = max(b.HeldAt, now)
	if contradicted && clamp(retry) > 0 {
		if !sliding && 2*clamp(retry) >= left && (b.Passed >= 2 || b.Passed == 1 && clamp(retry) <= left+b.Window/4) {
			// A fixed window let through what passed in it, and the 429
			// waits for about its end: the cap. (One that passed alone,
			// and a wait past the window's end: a spacing longer than the
			// window; a wait far short of the window's end: a limit of a
			// shorter period than the window the headers describe, such
			// as reactions claiming 200 per ten minutes at one per 250
			// ms. The hold keeps either.)
			b.Cap, b.CapLimit, b.CapAt = b.Passed, b.Limit, now
		} else {
			b.Hold = max(b.Hold, clamp(clamp(retry)+since))
			b.HoldLimit = b.Limit
		}
	}
	b.Sliding, b.Evidence = false, 0
	if b.Known {
		if b.Hold == 0 || b.HoldLimit != b.Limit {
			// The window is spent. (Under a hold of this limit the
			// headers' window is not the limit: the hold spaces what it
			// would grant, and the 429's pause holds its wait.)
			b.Remaining = 0
		}
		if b.ResetAt < b.Pause {
			b.ResetAt, b.Estimated = b.Pause, false
		}
	}
}

// sameFixedWindow reports whether a 429's headers h, saying no request is
// left, date from the same fixed window, on Discord's clock, as the
// response before them, which said some were: a fixed window's count only
// goes down, by the requests that arrived in between, which the model
// counted in what that response allowed. Discord counted fewer than its
// headers claim. (A sliding window's full-again moment moves with each
// request, so its drip, early at network latency, never matches; requests
// of routes whose bucket is not known yet may have spent the window.)
func (b *Bucket) sameFixedWindow(h Headers, probes int64) bool {
	return !b.Sliding && probes == 0 && h.Reset > 0 && b.ServerInstant && b.SeenRemaining > 0 &&
		h.Reset-b.Instant <= sameInstant && b.Instant-h.Reset <= sameInstant
}

// sameWindow reports whether headers h date, on Discord's clock, from the
// fixed window b counts (counted, the previous response's
// X-RateLimit-Reset): every response of one fixed window names the same
// end there, wherever and however late it is read.
func (b *Bucket) sameWindow(h Headers, counted int64) bool {
	return !b.Sliding && h.Reset > 0 && counted > 0 && h.ResetAfter >= 0 &&
		h.Reset-counted <= sameInstant && counted-h.Reset <= sameInstant
}

// sameInstant is how far apart, in milliseconds, two X-RateLimit-Reset
// values of one fixed window may be (Discord rounds them).
const sameInstant = 2

// Shared applies a 429 of scope shared: the resource is busy for everyone,
// the bucket's own counts stay as they are.
func (b *Bucket) Shared(now, retry int64) {
	b.Pause = max(b.Pause, now+clamp(retry))
	b.HeldAt = max(b.HeldAt, now)
}

// Seed holds b to at least one request at a time, hold apart (see Hold),
// for a route whose headers are known to overstate what Discord allows.
// A longer hold b learned stays. A credential's counter for routes without
// a bucket is never held, nor a bucket whose headers describe a window of
// at most TrustedWindow: the headers seen to overstate such routes claimed
// long windows (reactions: 200 per ten minutes), and a short window bounds
// what they can overstate to one window's worth, which a 429 then teaches
// (see Limited).
func (b *Bucket) Seed(hold int64) {
	if hold <= 0 || b.Unlimited || hold <= b.Hold || b.Known && b.Window > 0 && b.Window-b.Offset <= TrustedWindow {
		return
	}
	b.Hold = clamp(hold)
	b.HoldLimit = b.Limit
}

// TrustedWindow is the longest window, in milliseconds, of headers that a
// seeded hold gives way to (see Seed): the longest Reset-After seen, the
// offset aside.
const TrustedWindow = 1000

// Bound returns a lower bound of when a new claim on b, with ahead claims
// queued before it, can be granted (at least now).
func (b *Bucket) Bound(now, ahead int64) int64 {
	b.age(now)
	at := max(now, b.Pause)
	if b.Hold > 0 && !b.Unlimited {
		// One at a time, each a hold after the one before.
		at = max(at, b.HeldAt+b.Hold*(1+ahead))
	}
	if !b.Known || b.Limit <= 0 || b.Remaining > ahead {
		return at
	}
	if b.Sliding {
		// Slots come back one at a time: the next one when the model
		// drips (the drip of later ones, and the responses the requests
		// in flight wait for, are not counted).
		drip, _ := b.dripAt()
		return max(at, drip)
	}
	if b.ResetAt > now {
		// The refill at the reset serves the first limit waiters in line;
		// each further limit waits at least one more window.
		windows := (ahead - max(b.Remaining, 0)) / b.perWindow()
		at = max(at, b.ResetAt+windows*b.Span)
	}
	return at
}

// Idle reports whether b holds nothing worth keeping at now: no request in
// flight, no pause, and no window open.
func (b *Bucket) Idle(now int64) bool {
	if b.Pending > 0 || now < b.Pause || b.Hold > 0 && now < b.HeldAt+b.Hold || b.Cap > 0 && now < b.CapAt+CapMemory {
		return false
	}
	return b.Retired || !b.Known || b.ResetAt == 0 || now >= b.ResetAt
}

// maxDuration bounds durations read from responses (24 hours), so that
// absurd values cannot overflow the arithmetic.
const maxDuration = 24 * 3600 * 1000

func clamp(d int64) int64 { return min(max(d, 0), maxDuration) }

// ceilDiv returns a/b rounded up, for b > 0.
func ceilDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a > 0) == (b > 0) {
		q++
	}
	return q
}
