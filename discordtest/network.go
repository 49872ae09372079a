package discordtest

import (
	mathrand "math/rand/v2"
	"sync"
	"time"
)

// Leg is the delay of one direction of the network between a client and
// Discord: Base, plus a uniformly random share of Jitter, plus Stall for one
// request in StallEvery on average. Every duration is multiplied by the time
// scale of [WithTimeScale]; negative durations count as zero. The zero Leg
// adds no delay.
type Leg struct {
	// Base is the delay every request has.
	Base time.Duration
	// Jitter is the most a request gets on top of Base, drawn uniformly.
	Jitter time.Duration
	// StallEvery is N in "one request in N stalls", drawn at random for
	// each request; zero or less never stalls.
	StallEvery int
	// Stall is the extra delay of a stalled request, such as 2 s.
	Stall time.Duration
}

// Network is a latency profile: the two legs of a round trip, drawn
// independently for every request, so a response can overtake the response
// to an earlier request.
//
// Up is the client-to-Discord leg. The request counts when it has passed:
// the emulator takes its rate-limit decision, opens windows and logs the
// request ([LogEntry].Time) at that moment, as Discord counts a request when
// it arrives there, not when the client sent it. Down is the
// Discord-to-client leg: it passes after the decision and before the
// response is written, and a response's headers reach the client only then
// (which matters for telling avoidable 429s apart, see [Stats]).
//
// The zero Network adds no latency.
type Network struct {
	Up, Down Leg
}

// Names of the profiles [NetworkProfile] knows.
const (
	// ProfileLAN is [LANNetwork].
	ProfileLAN = "lan"
	// ProfileDiscord is [DiscordNetwork].
	ProfileDiscord = "discord"
	// ProfileStalls is [StallsNetwork].
	ProfileStalls = "stalls"
)

// LANNetwork is a client next to the server: each leg 0.5 ms plus up to
// 0.5 ms of jitter, a round trip of 1 to 2 ms.
func LANNetwork() Network {
	l := Leg{Base: 500 * time.Microsecond, Jitter: 500 * time.Microsecond}
	return Network{Up: l, Down: l}
}

// DiscordNetwork is a bot host the usual distance from Discord: each leg
// 10 ms plus up to 65 ms of jitter, a round trip of 20 to 150 ms. Requests
// sent together arrive in a different order, and responses overtake each
// other.
func DiscordNetwork() Network {
	l := Leg{Base: 10 * time.Millisecond, Jitter: 65 * time.Millisecond}
	return Network{Up: l, Down: l}
}

// StallsNetwork is [DiscordNetwork] with rare multi-second stalls: on each
// leg, one request in 200 is delayed by 2 s more. A request stalled on the
// way up counts at Discord long after it was sent; a response stalled on the
// way down keeps the client uninformed of a decision already taken.
func StallsNetwork() Network {
	n := DiscordNetwork()
	n.Up.StallEvery, n.Up.Stall = 200, 2*time.Second
	n.Down.StallEvery, n.Down.Stall = 200, 2*time.Second
	return n
}

// NetworkProfile returns the profile named "lan", "discord" or "stalls"
// (see [ProfileLAN], [ProfileDiscord], [ProfileStalls]) and whether the
// name is known.
func NetworkProfile(name string) (Network, bool) {
	switch name {
	case ProfileLAN:
		return LANNetwork(), true
	case ProfileDiscord:
		return DiscordNetwork(), true
	case ProfileStalls:
		return StallsNetwork(), true
	}
	return Network{}, false
}

// NetworkProfiles returns the names [NetworkProfile] knows, from the
// fastest network to the worst.
func NetworkProfiles() []string { return []string{ProfileLAN, ProfileDiscord, ProfileStalls} }

// MaxRoundTrip is the longest round trip the network gives a request that
// does not stall, before the time scale: both legs' Base plus Jitter.
func (n Network) MaxRoundTrip() time.Duration {
	return max(0, n.Up.Base) + max(0, n.Up.Jitter) + max(0, n.Down.Base) + max(0, n.Down.Jitter)
}

// WithNetwork sets the latency profile; see [Network] and [NetworkProfile].
// It replaces an earlier [WithLatency] or WithNetwork. The default is no
// latency.
func WithNetwork(n Network) Option {
	return optionFunc(func(c *config) { c.network = n })
}

// WithSeed seeds the random draws of the network's jitter and stalls, so that
// requests arriving in the same order are given the same delays, run after
// run. Without it the seed is random.
func WithSeed(seed uint64) Option {
	return optionFunc(func(c *config) { c.seed, c.seeded = seed, true })
}

// delays draws the network delays of requests. It is safe for concurrent
// use.
type delays struct {
	mu  sync.Mutex // guards rng
	rng *mathrand.Rand

	// Fixed after construction.
	net   Network
	scale func(time.Duration) time.Duration
}

// newDelays returns the draws of network n, seeded with seed.
func newDelays(n Network, seed uint64, scale func(time.Duration) time.Duration) *delays {
	return &delays{rng: mathrand.New(mathrand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), net: n, scale: scale}
}

// draw returns the delays of one request's two legs, already scaled. Both
// are drawn under one lock, so a seeded emulator gives every request the
// same pair whatever the interleaving of other requests' draws.
func (d *delays) draw() (up, down time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.scale(d.leg(d.net.Up)), d.scale(d.leg(d.net.Down))
}

// leg draws one leg's delay; the caller holds mu.
func (d *delays) leg(l Leg) time.Duration {
	t := max(0, l.Base)
	if j := max(0, l.Jitter); j > 0 {
		t += time.Duration(d.rng.Int64N(int64(j) + 1))
	}
	if l.StallEvery > 0 && l.Stall > 0 && d.rng.IntN(l.StallEvery) == 0 {
		t += l.Stall
	}
	return t
}
