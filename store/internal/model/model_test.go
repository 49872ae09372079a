package model

import (
	"math"
	"testing"
)

// FuzzObserve checks what no response, however malformed or reordered, may
// do to a bucket: panic, raise its remaining count without raising its
// limit, move its reset earlier, or end a pause.
func FuzzObserve(f *testing.F) {
	f.Add(int64(5), int64(0), int64(1000), int64(10), int64(5), int64(3), int64(200), int64(50), int64(0), false)
	f.Add(int64(10), int64(9), int64(100), int64(10), int64(10), int64(8), int64(200), int64(1), int64(2), true)
	f.Add(int64(1), int64(0), int64(-1), int64(0), int64(math.MaxInt64), int64(-5), int64(math.MinInt64), int64(7), int64(1), false)
	f.Fuzz(func(t *testing.T, limit, remaining, resetAfter, offset, limit2, remaining2, resetAfter2, step, probes int64, sliding bool) {
		const now = 1_700_000_000_000
		step = min(max(step, 0), 1<<30)
		var b Bucket
		b.Observe(now, Headers{Limit: limit, Remaining: remaining, ResetAfter: resetAfter, Offset: offset}, probes)
		b.Take(now)
		b.Sliding = sliding
		b.Limited(now, 500, nil, 0)
		before := b
		later := int64(now) + step
		b.Observe(later, Headers{Limit: limit2, Remaining: remaining2, ResetAfter: resetAfter2, Offset: offset}, probes)
		if limit2 <= before.Limit && b.Remaining > before.Remaining {
			t.Errorf("Observe(limit %d, remaining %d) raised Remaining %d -> %d under limit %d", limit2, remaining2, before.Remaining, b.Remaining, before.Limit)
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
