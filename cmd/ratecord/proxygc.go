package main

import (
	"math"
	"math/bits"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// proxyMemoryFloor is the soft memory limit of the Go runtime while the
// proxy's live heap is small: the garbage collector runs when the memory
// the runtime holds (heap, stacks, its own metadata) nears it. Together with
// the executable's pages it keeps the resident size under 25 MB: 23.5 to
// 24 MB at the peak under proxybench's load, where 15 MiB reached 25.2.
const proxyMemoryFloor = 14 << 20

// proxyGCPercent is the headroom over the live heap, in percent, once the
// live heap has outgrown the floor: what GOGC=25 gave before the floor.
const proxyGCPercent = 25

// gcTuneInterval is how often the memory limit follows the live heap.
const gcTuneInterval = 100 * time.Millisecond

// gcIdleCollect is how long the collector may rest while the limit is above
// the floor. With GOGC off, nothing collects until the heap reaches the
// limit, which a large live heap (a burst of many tokens) raised: memory
// the proxy no longer uses (the store forgets idle credentials within
// seconds) would stay until the next burst. A collection after this long
// finds it free, brings the limit back down and returns it to the system:
// within a minute of idling.
const gcIdleCollect = 30 * time.Second

// gcTuner runs the garbage collector by a soft memory limit instead of by
// GOGC: the limit is proxyMemoryFloor, or the runtime's memory besides the
// heap plus the live heap and a quarter, whichever is larger. A proxy's
// live heap is a few megabytes; GOGC=25 would collect every time it grew by
// a quarter of that, most of a core's time at a high rate, while the floor
// lets the heap use the room the resident size allows. A large live heap
// (many tokens) raises the limit with it, so that the collector never runs
// without end against a limit the live heap alone exceeds.
//
// It owns one goroutine, started by startGCTuner and ended by stop, which
// also restores the collector's previous settings.
type gcTuner struct {
	floor     int64
	percent   int64
	samples   []metrics.Sample
	cycles    uint64    // the collections counted at the last update
	limit     int64     // the limit set at the last update
	collected time.Time // when an update last saw a new collection
	forced    int       // the collections it ran, for tests

	oldPercent int
	oldLimit   int64
	quit       chan struct{}
	done       chan struct{}
}

// startGCTuner turns GOGC off, sets the memory limit to floor and starts
// following the live heap.
func startGCTuner(floor, percent int64) *gcTuner {
	t := newGCTuner(floor, percent, time.Now())
	// The limit first, so that the collector is never without a bound.
	t.oldLimit = debug.SetMemoryLimit(floor)
	t.oldPercent = debug.SetGCPercent(-1)
	go t.run()
	return t
}

// newGCTuner returns a tuner that has not touched the collector's settings
// yet, as of now.
func newGCTuner(floor, percent int64, now time.Time) *gcTuner {
	t := &gcTuner{floor: floor, percent: percent, limit: floor, collected: now, quit: make(chan struct{}), done: make(chan struct{})}
	// The order update reads them in.
	for _, name := range []string{
		"/gc/cycles/total:gc-cycles",
		"/gc/heap/live:bytes",
		"/memory/classes/total:bytes",
		"/memory/classes/heap/released:bytes",
		"/memory/classes/heap/objects:bytes",
		"/memory/classes/heap/free:bytes",
		"/memory/classes/heap/unused:bytes",
	} {
		t.samples = append(t.samples, metrics.Sample{Name: name})
	}
	return t
}

func (t *gcTuner) run() {
	defer close(t.done)
	tick := time.NewTicker(gcTuneInterval)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			t.update(now)
		case <-t.quit:
			return
		}
	}
}

// update sets the limit from the last collection's live heap, if a
// collection ran since the last update; at now, it first runs one if none
// ran for gcIdleCollect while the limit is above the floor.
func (t *gcTuner) update(now time.Time) {
	metrics.Read(t.samples)
	cycles := t.samples[0].Value.Uint64()
	if cycles == t.cycles {
		if t.limit <= t.floor || now.Sub(t.collected) < gcIdleCollect {
			return
		}
		debug.FreeOSMemory() // a collection, and the free memory returned
		t.forced++
		metrics.Read(t.samples)
		cycles = t.samples[0].Value.Uint64()
	}
	t.cycles, t.collected = cycles, now
	v := func(i int) uint64 { return t.samples[i].Value.Uint64() }
	live := v(1)
	heap := v(3) + v(4) + v(5) + v(6) // released, objects, free, unused
	other := v(2) - min(heap, v(2))   // stacks, the runtime's metadata, buffers
	t.limit = memoryLimit(t.floor, t.percent, live, other)
	debug.SetMemoryLimit(t.limit)
}

// memoryLimit returns the soft memory limit for a live heap of live bytes
// when the runtime holds other bytes besides the heap: floor, or other plus
// live plus percent of it, whichever is larger.
func memoryLimit(floor, percent int64, live, other uint64) int64 {
	p := uint64(percent)
	headroom := live/100*p + live%100*p/100
	want, carry1 := bits.Add64(other, live, 0)
	want, carry2 := bits.Add64(want, headroom, 0)
	if carry1+carry2 != 0 || want > math.MaxInt64 {
		return math.MaxInt64
	}
	return max(floor, int64(want))
}

// stop ends the goroutine and restores the collector's settings from
// before startGCTuner. It must be called once.
func (t *gcTuner) stop() {
	close(t.quit)
	<-t.done
	debug.SetGCPercent(t.oldPercent)
	debug.SetMemoryLimit(t.oldLimit)
}
