package redisstore_test

import (
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// TestRecallAcrossProcesses: a 429 that one process reads, and a lowered
// limit, take back the grants of the bucket that another process holds and
// has not sent, well before those grants would lapse of age; a grant of
// another bucket, or of another credential, is left alone.
func TestRecallAcrossProcesses(t *testing.T) {
	tests := []struct {
		name  string
		spend store.Update // the response that spends the bucket
	}{
		{"429", store.Update{Sent: true, Status: 429, Scope: store.ScopeUser, RetryAfter: 300 * time.Millisecond,
			Bucket: "h", HasLimit: true, Limit: 5, Remaining: 0, ResetAfter: 300 * time.Millisecond}},
		{"lowered limit", store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true, Limit: 2, Remaining: 0,
			ResetAfter: time.Minute}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			addr := redisAddr(t)
			prefix := testPrefix(t)
			a := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithLease(0))
			b := redisstore.New(newClient(t, addr), redisstore.WithPrefix(prefix), redisstore.WithLease(0))
			defer a.Close()
			defer b.Close()
			ctx := t.Context()
			c := store.Claim{Credential: "recall", Route: "POST /channels/:id/messages", Major: "channels/1"}
			other := c
			other.Major = "channels/2"
			stranger := c
			stranger.Credential = "recall-other"
			acquire := func(s *redisstore.Store, c store.Claim) *store.Reservation {
				t.Helper()
				r, err := s.Acquire(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			learn := func(s *redisstore.Store, c store.Claim) {
				t.Helper()
				if err := acquire(s, c).Report(ctx, store.Update{Sent: true, Status: 200, Bucket: "h", HasLimit: true,
					Limit: 5, Remaining: 4, ResetAfter: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
			learn(a, c)
			learn(b, other)
			learn(b, stranger)
			subscribed(t, a)
			subscribed(t, b)
			sent := acquire(a, c)
			held, held2 := acquire(b, c), acquire(b, c)
			untouched, unrelated := acquire(b, other), acquire(b, stranger)
			defer held.Cancel()
			defer held2.Cancel()
			defer untouched.Cancel()
			defer unrelated.Cancel()
			if held.Lapsed() {
				t.Fatal("a fresh grant lapsed before anything spent its bucket")
			}
			if err := sent.Report(ctx, tt.spend); err != nil {
				t.Fatal(err)
			}
			for {
				lapsed := held.Lapsed() && held2.Lapsed()
				if !time.Now().Before(held.SendBy) {
					t.Fatal("process b's grants of the spent bucket did not lapse before their SendBy")
				}
				if lapsed {
					break
				}
				time.Sleep(time.Millisecond)
			}
			if untouched.Lapsed() || unrelated.Lapsed() {
				t.Errorf("grants of another major and another credential: Lapsed() = %v, %v; want false",
					untouched.Lapsed(), unrelated.Lapsed())
			}
			// Given back, the claims of process b wait for the bucket.
			held.Cancel()
			held2.Cancel()
			nowait := c
			nowait.MaxWait = 100 * time.Millisecond
			if r, err := b.Acquire(ctx, nowait); err == nil {
				r.Cancel()
				t.Fatal("process b was granted a slot of the spent bucket at once")
			}
		})
	}
}
