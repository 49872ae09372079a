package redisstore

import (
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// TestQueueUntil: a queue's waiters wait until the latest of their
// deadlines (a MaxWait counting from a waiter's start, a NoWait waiter not
// at all), or without a bound when one of them has none.
func TestQueueUntil(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name    string
		waiters []*waiter
		want    time.Time
	}{
		{"none", nil, time.Time{}},
		{"deadline", []*waiter{{start: t0, deadline: at(200)}}, at(200)},
		{"latest deadline", []*waiter{{start: t0, deadline: at(200)}, {start: at(50), deadline: at(900)}}, at(900)},
		{"max wait before deadline", []*waiter{{start: at(10), deadline: at(900), claim: store.Claim{MaxWait: 100 * time.Millisecond}}}, at(110)},
		{"max wait alone", []*waiter{{start: at(10), claim: store.Claim{MaxWait: time.Second}}}, at(1010)},
		{"no wait", []*waiter{{start: at(30), deadline: at(900), claim: store.Claim{NoWait: true}}}, at(30)},
		{"one without a bound", []*waiter{{start: t0, deadline: at(200)}, {start: t0}}, time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q := &lqueue{waiters: tt.waiters}
			if got := q.until(); !got.Equal(tt.want) {
				t.Errorf("until = %v; want %v", got, tt.want)
			}
		})
	}
	if got := lifeOf(time.Time{}, t0); got != 0 {
		t.Errorf("lifeOf(zero) = %d; want 0 (no bound)", got)
	}
	if got := lifeOf(at(1500), at(1000)); got != 500 {
		t.Errorf("lifeOf(500 ms ahead) = %d; want 500", got)
	}
	if got := lifeOf(at(900), at(1000)); got != 1 {
		t.Errorf("lifeOf(past) = %d; want 1 (at least a millisecond)", got)
	}
	if got := lifeOf(at(1000).Add(time.Microsecond), at(1000)); got != 1 {
		t.Errorf("lifeOf(1 µs ahead) = %d; want 1 (rounded up)", got)
	}
}
