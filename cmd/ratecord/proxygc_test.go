package main

import (
	"math"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

func TestMemoryLimit(t *testing.T) {
	t.Parallel()
	const mb = 1 << 20
	tests := []struct {
		name        string
		live, other uint64
		want        int64
	}{
		{"small heap: the floor", 2 * mb, 8 * mb, 15 * mb},
		{"nothing yet", 0, 0, 15 * mb},
		{"at the floor", 4 * mb, 10 * mb, 15 * mb},
		{"large heap: a quarter over it", 40 * mb, 10 * mb, 10*mb + 40*mb + 10*mb},
		{"beyond int64", math.MaxUint64 / 2, math.MaxUint64 / 2, math.MaxInt64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := memoryLimit(15*mb, 25, tt.live, tt.other); got != tt.want {
				t.Errorf("memoryLimit(15 MiB, 25, %d, %d) = %d; want %d", tt.live, tt.other, got, tt.want)
			}
		})
	}
}

// TestGCTunerRestores runs the tuner through collections and checks that it
// turns GOGC off, keeps the limit at or above the floor, and restores both
// settings when stopped. Not parallel: the settings are the process's.
func TestGCTunerRestores(t *testing.T) {
	const floor = 64 << 20
	percent := debug.SetGCPercent(-1)
	debug.SetGCPercent(percent)
	limit := debug.SetMemoryLimit(-1)

	tuner := startGCTuner(floor, 25)
	if got := debug.SetGCPercent(-1); got != -1 {
		t.Errorf("GOGC while tuning = %d; want -1 (off)", got)
	}
	for range 3 {
		runtime.GC()
		tuner.update(time.Now())
		if got := debug.SetMemoryLimit(-1); got < floor {
			t.Errorf("memory limit while tuning = %d; want at least the floor %d", got, floor)
		}
	}
	tuner.stop()
	if got := debug.SetGCPercent(percent); got != percent {
		t.Errorf("GOGC after stop = %d; want %d", got, percent)
	}
	if got := debug.SetMemoryLimit(-1); got != limit {
		t.Errorf("memory limit after stop = %d; want %d", got, limit)
	}
}

// TestGCTunerCollectsWhenIdle raises the limit with a large live heap, lets
// it go, and checks that the tuner collects once no collection ran for
// gcIdleCollect, not before, and brings the limit back to the floor. Not
// parallel: the settings are the process's.
func TestGCTunerCollectsWhenIdle(t *testing.T) {
	const floor = 16 << 20
	percent := debug.SetGCPercent(-1)
	limit := debug.SetMemoryLimit(-1)
	defer func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}()
	now := time.Now()
	tuner := newGCTuner(floor, 25, now)
	big := make([]byte, 64<<20)
	for i := range big {
		big[i] = 1
	}
	runtime.GC()
	tuner.update(now)
	if got := debug.SetMemoryLimit(-1); got < 64<<20 {
		t.Fatalf("memory limit with 64 MiB live = %d; want above it", got)
	}
	runtime.KeepAlive(big)
	big = nil

	tuner.update(now.Add(gcIdleCollect - time.Second))
	if tuner.forced != 0 {
		t.Errorf("the tuner collected %d times before gcIdleCollect; want none", tuner.forced)
	}
	tuner.update(now.Add(gcIdleCollect))
	if tuner.forced != 1 {
		t.Errorf("the tuner collected %d times once no collection ran for gcIdleCollect; want 1", tuner.forced)
	}
	if got := debug.SetMemoryLimit(-1); got != floor {
		t.Errorf("memory limit after the idle collection = %d; want the floor %d", got, floor)
	}
	// At the floor it lets the collector rest.
	tuner.update(now.Add(3 * gcIdleCollect))
	if tuner.forced != 1 {
		t.Errorf("the tuner collected %d times at the floor; want no more", tuner.forced)
	}
}
