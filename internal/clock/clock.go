// Package clock lets ratecord's transport and stores read time and arm timers
// through a seam that tests can drive by hand.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and runs functions later.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d and returns a Timer that
	// can stop it.
	AfterFunc(d time.Duration, f func()) Timer
	// NewTimer returns a timer whose channel receives once after d.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of [time.Timer] that ratecord uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real is the system clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time { return r.t.C }
func (r realTimer) Stop() bool          { return r.t.Stop() }

// Fake is a clock that moves only when Advance is called. It is safe for
// concurrent use.
type Fake struct {
	mu     sync.Mutex // guards now, timers and seq
	now    time.Time
	timers []*fakeTimer
	seq    int
}

// NewFake returns a Fake clock set to start.
func NewFake(start time.Time) *Fake { return &Fake{now: start} }

type fakeTimer struct {
	c   *Fake
	at  time.Time
	seq int
	f   func()
	ch  chan time.Time
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	for i, x := range t.c.timers {
		if x == t {
			t.c.timers = append(t.c.timers[:i], t.c.timers[i+1:]...)
			return true
		}
	}
	return false
}

// Now returns the fake time.
func (c *Fake) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// AfterFunc schedules f to run in its own goroutine when the clock passes d.
func (c *Fake) AfterFunc(d time.Duration, f func()) Timer { return c.add(d, f) }

// NewTimer returns a timer that fires when the clock passes d.
func (c *Fake) NewTimer(d time.Duration) Timer { return c.add(d, nil) }

func (c *Fake) add(d time.Duration, f func()) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	t := &fakeTimer{c: c, at: c.now.Add(d), seq: c.seq, f: f, ch: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	return t
}

// Timers returns the number of armed timers.
func (c *Fake) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.timers)
}

// Advance moves the clock forward by d and fires every timer that is due,
// in the order of their deadlines.
func (c *Fake) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	kept := c.timers[:0]
	for _, t := range c.timers {
		if !t.at.After(c.now) {
			due = append(due, t)
		} else {
			kept = append(kept, t)
		}
	}
	c.timers = kept
	now := c.now
	c.mu.Unlock()
	sort.Slice(due, func(i, j int) bool {
		if due[i].at.Equal(due[j].at) {
			return due[i].seq < due[j].seq
		}
		return due[i].at.Before(due[j].at)
	})
	for _, t := range due {
		if t.f != nil {
			go t.f()
		} else {
			t.ch <- now
		}
	}
}
