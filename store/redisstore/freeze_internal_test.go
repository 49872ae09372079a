package redisstore

import (
	"testing"
	"time"
)

// TestFreezeWatch drives the watch's ticks by hand: on-time ticks record
// nothing, a late tick records the span it missed, and a watch whose
// ticker has not run since it was due counts the freeze it is waking from.
func TestFreezeWatch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	w := newFreezeWatch(func() time.Time { return now })
	if !w.touch() {
		t.Fatal("touch of a stopped watch = false; want true (start the ticker)")
	}
	if w.touch() {
		t.Fatal("touch of a running watch = true; want false")
	}
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	tick := func(d time.Duration) { now = at(d); w.tick(w.ns(now)) }

	// On time, with jitter under the slack: no freeze.
	for d := 10 * time.Millisecond; d <= 200*time.Millisecond; d += 10 * time.Millisecond {
		tick(d + 5*time.Millisecond)
	}
	if fz := w.frozen(t0, at(300*time.Millisecond)); fz != 0 {
		t.Errorf("frozen after on-time ticks = %v; want 0", fz)
	}

	// A tick 800 ms late: the span from when it was due is a freeze.
	tick(1005 * time.Millisecond)
	want := 1005*time.Millisecond - 215*time.Millisecond
	if fz := w.frozen(t0, at(2*time.Second)); fz != want {
		t.Errorf("frozen over the late tick = %v; want %v", fz, want)
	}
	if fz := w.frozen(at(600*time.Millisecond), at(700*time.Millisecond)); fz != 100*time.Millisecond {
		t.Errorf("frozen over part of the freeze = %v; want 100ms", fz)
	}

	// A call begun at 200 ms with a 500 ms timeout, checked at 1,010 ms:
	// the process ran from 200 to 215 ms and from 1,005 ms, 20 ms in
	// all, so 480 ms are left.
	if left := w.liveLeft(at(200*time.Millisecond), at(1010*time.Millisecond), 500*time.Millisecond); left != 480*time.Millisecond {
		t.Errorf("liveLeft = %v; want 480ms", left)
	}
	// A call that ran its whole timeout: none left.
	if left := w.liveLeft(at(1010*time.Millisecond), at(1600*time.Millisecond), 500*time.Millisecond); left != 0 {
		t.Errorf("liveLeft of a call that ran = %v; want 0", left)
	}

	// Waking from a freeze before the ticker ran: the watch counts the
	// span since the last tick was due.
	now = at(2500 * time.Millisecond)
	if fz := w.frozen(at(1500*time.Millisecond), now); fz != time.Second {
		t.Errorf("frozen while waking = %v; want 1s (from 1,500 ms, the ticker due since 1,015 ms)", fz)
	}
	// The extension is bounded.
	if left := w.liveLeft(at(1010*time.Millisecond), at(1010*time.Millisecond).Add(500*time.Millisecond+maxFreezeExtension), 500*time.Millisecond); left != 0 {
		t.Errorf("liveLeft past the extension = %v; want 0", left)
	}
}

// TestFreezeWatchStops: the ticker stops when its owner closes, and when
// no call asked for it for freezeIdle.
func TestFreezeWatchStops(t *testing.T) {
	w := newFreezeWatch(nil)
	w.touch()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { w.run(stop); close(done) }()
	close(stop)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after stop")
	}
	if w.running.Load() {
		t.Error("running after stop; want false")
	}

	w.touch()
	w.used.Store(w.ns(time.Now().Add(-2 * freezeIdle)))
	done = make(chan struct{})
	go func() { w.run(make(chan struct{})); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return once idle")
	}
	if !w.touch() {
		t.Error("touch after the idle stop = false; want true")
	}
}
