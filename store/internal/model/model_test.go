package model

import (
	"math"
	"testing"
)

// FuzzObserve checks what no response, however malformed or reordered, may
// do to a bucket: panic, raise its remaining count without raising its
// limit (unless it dates a later window, whose count it then gives, and
// no more), move its reset earlier, or end a pause.
func FuzzObserve(f *testing.F) {
	f.Add(int64(5), int64(0), int64(1000), int64(10), int64(5), int64(3), int64(200), int64(50), int64(0), false)
	f.Add(int64(10), int64(9), int64(100), int64(10), int64(10), int64(8), int64(200), int64(1), int64(2), true)
	f.Add(int64(1), int64(0), int64(-1), int64(0), int64(math.MaxInt64), int64(-5), int64(math.MinInt64), int64(7), int64(1), false)
	f.Fuzz(func(t *testing.T, limit, remaining, resetAfter, offset, limit2, remaining2, resetAfter2, step, probes int64, sliding bool) {
		const now = 1_700_000_000_000
		step = min(max(step, 0), 1<<30)
		var b Bucket
		b.Observe(now, Headers{Limit: limit, Remaining: remaining, ResetAfter: resetAfter, Offset: offset}, probes)
		b.Take(now, 250)
		b.Sliding = sliding
		b.Limited(now, 500, nil, 0)
		before := b
		later := int64(now) + step
		b.Observe(later, Headers{Limit: limit2, Remaining: remaining2, ResetAfter: resetAfter2, Offset: offset}, probes)
		after := resetAfter2
		if after < 0 {
			after = max(before.Window, 1000)
		}
		newer, _ := before.windowOf(Headers{Limit: limit2, Remaining: remaining2, ResetAfter: resetAfter2}, later+clamp(after)+clamp(offset), 0)
		if limit2 <= before.Limit && b.Remaining > before.Remaining && !newer {
			t.Errorf("Observe(limit %d, remaining %d) raised Remaining %d -> %d under limit %d", limit2, remaining2, before.Remaining, b.Remaining, before.Limit)
		}
		if newer && b.Remaining > before.Remaining && b.Remaining > remaining2 {
			t.Errorf("Observe(limit %d, remaining %d) of a later window left Remaining %d, more than it said", limit2, remaining2, b.Remaining)
		}
		if b.ResetAt < before.ResetAt && !before.Estimated {
			t.Errorf("Observe moved the reset earlier: %d -> %d", before.ResetAt, b.ResetAt)
		}
		if b.Pause != before.Pause {
			t.Errorf("Observe changed the pause: %d -> %d", before.Pause, b.Pause)
		}
		if later < b.Pause && b.Available(later) {
			t.Errorf("Available during a pause")
		}
		if math.IsNaN(b.Level) || math.IsInf(b.Level, 0) {
			t.Errorf("Level = %v", b.Level)
		}
		if w := b.WakeAt(later); w != 0 && w < later {
			t.Errorf("WakeAt(%d) = %d, in the past", later, w)
		}
	})
}

// TestRoomCountsTakes checks Room and TakeN against what they stand for:
// Available and Take, one slot at a time, on buckets of every kind.
func TestRoomCountsTakes(t *testing.T) {
	const now = 1_700_000_000_000
	var cases []Bucket
	for _, limit := range []int64{1, 2, 5, 20, 200} {
		for _, remaining := range []int64{0, 1, limit / 2, limit} {
			for _, sliding := range []bool{false, true} {
				for _, pending := range []int64{0, 1, 3} {
					for _, level := range []float64{0, 0.5, float64(limit) / 2, float64(limit) - 0.25, float64(limit)} {
						b := Bucket{Known: true, Limit: limit, Remaining: remaining, Window: 1000, Offset: 10,
							Sliding: sliding, Pending: pending, Level: level, LevelAt: now - 37, ResetAt: now + 500}
						cases = append(cases, b)
						held := b
						held.Hold, held.HeldAt = 250, now-300
						cases = append(cases, held)
						if pending > 0 {
							arrived := b // its requests in flight have reached Discord (see Aged)
							arrived.ArriveBy = now - 20
							cases = append(cases, arrived)
						}
					}
				}
			}
		}
	}
	cases = append(cases, Bucket{}, Bucket{Probe: true}, Bucket{Pending: 1}, Bucket{Unlimited: true, Pending: 4},
		Bucket{Known: true, Limit: 5, Remaining: 0, ResetAt: now - 1, Window: 1000},
		Bucket{Known: true, Limit: 5, Remaining: 0, ResetAt: now - 1, Window: 1000, Pending: 1},
		Bucket{Known: true, Limit: 5, Remaining: 3, Window: 1000, Pause: now + 10})
	for i, b := range cases {
		for _, most := range []int64{0, 1, 3, 64} {
			loop := b
			n := int64(0)
			for n < most && loop.Available(now) {
				loop.Take(now, 250)
				n++
			}
			got := b
			if r := got.Room(now, most); r != n {
				t.Errorf("case %d %+v: Room(now, %d) = %d; Available/Take grant %d", i, b, most, r, n)
				continue
			}
			got.TakeN(now, n, 250)
			if got != loop {
				t.Errorf("case %d: TakeN(%d) = %+v; %d Takes = %+v", i, n, got, n, loop)
			}
		}
	}
}
