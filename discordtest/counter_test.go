package discordtest

import (
	"testing"
	"time"
)

// step is one call on a counter at an offset from the start.
type step struct {
	at        time.Duration
	wantOK    bool
	wantWait  time.Duration // when !wantOK
	wantState state         // after the call
}

func runSteps(t *testing.T, c counter, l limits, steps []step) {
	t.Helper()
	t0 := startTime()
	for i, s := range steps {
		now := t0.Add(s.at)
		ok, wait := take(c, now, l)
		if ok != s.wantOK || (!ok && wait != s.wantWait) {
			t.Fatalf("step %d at %v: take = %v, %v; want %v, %v", i, s.at, ok, wait, s.wantOK, s.wantWait)
		}
		if got := c.state(now, l); got != s.wantState {
			t.Fatalf("step %d at %v: state = %+v; want %+v", i, s.at, got, s.wantState)
		}
	}
}

func TestFixedWindowCounter(t *testing.T) {
	t.Parallel()
	l := limits{limit: 3, window: 10 * time.Second}
	c := &fixedWindow{}
	runSteps(t, c, l, []step{
		{at: 0, wantOK: true, wantState: state{remaining: 2, resetAfter: 10 * time.Second}},
		{at: time.Second, wantOK: true, wantState: state{remaining: 1, resetAfter: 9 * time.Second}},
		{at: 2 * time.Second, wantOK: true, wantState: state{remaining: 0, resetAfter: 8 * time.Second}},
		{at: 3 * time.Second, wantOK: false, wantWait: 7 * time.Second, wantState: state{remaining: 0, resetAfter: 7 * time.Second}},
		{at: 9*time.Second + 999*time.Millisecond, wantOK: false, wantWait: time.Millisecond, wantState: state{remaining: 0, resetAfter: time.Millisecond}},
		// The window opens again at the first request after it has passed.
		{at: 12 * time.Second, wantOK: true, wantState: state{remaining: 2, resetAfter: 10 * time.Second}},
	})
	if c.idle(startTime().Add(21*time.Second), l) {
		t.Errorf("idle before the window ended")
	}
	if !c.idle(startTime().Add(22*time.Second), l) {
		t.Errorf("not idle after the window ended")
	}
}

func TestSlidingWindowCounter(t *testing.T) {
	t.Parallel()
	l := limits{limit: 5, window: 5 * time.Second}
	c := &slidingWindow{}
	runSteps(t, c, l, []step{
		{at: 0, wantOK: true, wantState: state{remaining: 4, resetAfter: 1 * time.Second}},
		{at: 0, wantOK: true, wantState: state{remaining: 3, resetAfter: 2 * time.Second}},
		{at: 0, wantOK: true, wantState: state{remaining: 2, resetAfter: 3 * time.Second}},
		{at: 0, wantOK: true, wantState: state{remaining: 1, resetAfter: 4 * time.Second}},
		{at: 0, wantOK: true, wantState: state{remaining: 0, resetAfter: 5 * time.Second}},
		{at: 0, wantOK: false, wantWait: time.Second, wantState: state{remaining: 0, resetAfter: 5 * time.Second}},
		{at: 500 * time.Millisecond, wantOK: false, wantWait: 500 * time.Millisecond, wantState: state{remaining: 0, resetAfter: 4500 * time.Millisecond}},
		// One slot comes back after one fifth of the window.
		{at: time.Second, wantOK: true, wantState: state{remaining: 0, resetAfter: 5 * time.Second}},
		// Two seconds later two slots are free; one is taken.
		{at: 3 * time.Second, wantOK: true, wantState: state{remaining: 1, resetAfter: 4 * time.Second}},
	})
	if c.idle(startTime().Add(6*time.Second), l) {
		t.Errorf("idle before the bucket drained")
	}
	if !c.idle(startTime().Add(7*time.Second), l) {
		t.Errorf("not idle after the bucket drained")
	}
}

func TestSlidingWindowLimitChange(t *testing.T) {
	t.Parallel()
	c := &slidingWindow{}
	now := startTime()
	for range 4 {
		take(c, now, limits{limit: 5, window: 5 * time.Second})
	}
	// Lowering the limit to 2 leaves the bucket over full.
	l := limits{limit: 2, window: 5 * time.Second}
	ok, wait := c.check(now, l)
	if ok || wait != 7500*time.Millisecond {
		t.Fatalf("check after lowering the limit = %v, %v; want false, 7.5s", ok, wait)
	}
	if got, want := c.state(now, l), (state{remaining: 0, resetAfter: 10 * time.Second}); got != want {
		t.Fatalf("state = %+v; want %+v", got, want)
	}
}

func TestSlidingLogCounter(t *testing.T) {
	t.Parallel()
	l := limits{limit: 3, window: time.Second}
	c := &slidingLog{}
	runSteps(t, c, l, []step{
		{at: 0, wantOK: true, wantState: state{remaining: 2, resetAfter: time.Second}},
		{at: 100 * time.Millisecond, wantOK: true, wantState: state{remaining: 1, resetAfter: time.Second}},
		{at: 200 * time.Millisecond, wantOK: true, wantState: state{remaining: 0, resetAfter: time.Second}},
		// Unlike a leaky bucket, nothing comes back until the first request
		// leaves the window.
		{at: 900 * time.Millisecond, wantOK: false, wantWait: 100 * time.Millisecond, wantState: state{remaining: 0, resetAfter: 300 * time.Millisecond}},
		{at: time.Second, wantOK: true, wantState: state{remaining: 0, resetAfter: time.Second}},
	})
	if n := len(c.times); n > l.limit+1 {
		t.Errorf("log holds %d times; want at most %d", n, l.limit+1)
	}
	for range 100 {
		c.add(startTime().Add(1500*time.Millisecond), l)
	}
	if n := len(c.times); n > l.limit+1 {
		t.Errorf("log holds %d times after 100 adds; want at most %d", n, l.limit+1)
	}
	if !c.idle(startTime().Add(3*time.Second), l) {
		t.Errorf("not idle after the window passed")
	}
}
