package redisstore

import (
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
)

// TestLocalUpdateShares: the local limiter's bucket is a process's share
// of the bucket all processes use: a limit of 8 with 4 shares is 2 per
// window; a limit of 1 with 4 shares is 1 per 4 windows, so that 4
// processes limiting locally send no more than 1 per window together.
func TestLocalUpdateShares(t *testing.T) {
	s := New(nil, WithLocalShare(4))
	off := s.pol.ResetOffset
	for _, tc := range []struct {
		limit     int
		window    time.Duration
		wantLimit int
		wantAfter time.Duration
	}{
		{8, 2 * time.Second, 2, 2*time.Second - off},
		{4, 2 * time.Second, 1, 2*time.Second - off},
		{1, 2 * time.Second, 1, 8*time.Second - off},
		{2, time.Second, 1, 2*time.Second - off},
		{1, 30 * time.Second, 1, maxHold - off},
	} {
		u := s.localUpdate(store.Update{Sent: true, Status: 200, HasLimit: true, Limit: tc.limit, Remaining: tc.limit - 1, ResetAfter: 100 * time.Millisecond}, tc.window)
		if u.Limit != tc.wantLimit || u.Remaining != 0 || u.ResetAfter != tc.wantAfter {
			t.Errorf("limit %d, window %v: local update = limit %d, remaining %d, reset after %v; want %d, 0, %v",
				tc.limit, tc.window, u.Limit, u.Remaining, u.ResetAfter, tc.wantLimit, tc.wantAfter)
		}
	}
}
