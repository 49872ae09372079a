package ratecord_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jarcoal/httpmock"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
)

// lapsingStore grants through a memory store, and its first lapses
// grants lapse before they are used: as if the process had been frozen
// between the grant and the write.
type lapsingStore struct {
	*memstore.Store
	lapses atomic.Int32

	mu        sync.Mutex
	retries   []bool // each claim's Retry, in order
	cancelled int    // grants given back unsent
	answers   []bool // when set, what Lapsed answers, in order (then false)
}

func (s *lapsingStore) Acquire(ctx context.Context, c store.Claim) (*store.Reservation, error) {
	inner, err := s.Store.Acquire(ctx, c)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.retries = append(s.retries, c.Retry)
	s.mu.Unlock()
	r := store.NewReservation(s, c, inner.Bucket, inner.Waited, inner, 0)
	r.SendBy = time.Now()
	return r, nil
}

func (s *lapsingStore) Lapsed(*store.Reservation) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.answers != nil {
		if len(s.answers) == 0 {
			return false
		}
		a := s.answers[0]
		s.answers = s.answers[1:]
		return a
	}
	return s.lapses.Add(-1) >= 0
}

// record returns each claim's Retry, in order, and how many grants were
// given back unsent.
func (s *lapsingStore) record() (retries []bool, cancelled int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.retries), s.cancelled
}

// lapseServer returns a mock Discord whose message route answers with a
// bucket of 10 per second.
func lapseServer() *httpmock.MockTransport {
	mock := httpmock.NewMockTransport()
	mock.RegisterRegexpResponder("POST", messagesRE, newFakeDiscord().bucket("msg", 10, time.Second, false))
	return mock
}

func (s *lapsingStore) Settle(ctx context.Context, r *store.Reservation, u store.Update) error {
	h, _ := r.Handle()
	if !u.Sent {
		s.mu.Lock()
		s.cancelled++
		s.mu.Unlock()
	}
	return h.(*store.Reservation).Report(ctx, u)
}

// TestLapsedGrantIsClaimedAgain: a request whose grant lapsed before it
// could leave is not sent on it: the grant goes back, the request claims
// again keeping its place in line (a retry's claim), an EventLapsed says
// so, and the request is sent once, on a good grant. A store whose every
// grant lapses (its answers slower than half its hold) does not keep the
// request claiming forever: after three lapses it goes on the fourth grant.
func TestLapsedGrantIsClaimedAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		lapses, claims, events int
	}{
		{lapses: 2, claims: 3, events: 2},
		{lapses: 100, claims: 4, events: 3},
	} {
		t.Run(fmt.Sprintf("%d lapses", tc.lapses), func(t *testing.T) {
			t.Parallel()
			st := &lapsingStore{Store: memstore.New()}
			t.Cleanup(func() { st.Close() })
			st.lapses.Store(int32(tc.lapses))
			mock := lapseServer()
			var mu sync.Mutex
			var events []ratecord.Event
			tr := ratecord.NewTransport(mock, ratecord.WithStore(st), ratecord.WithEventHandler(func(e ratecord.Event) {
				mu.Lock()
				events = append(events, e)
				mu.Unlock()
			}))
			t.Cleanup(func() { tr.Close() })
			c := &http.Client{Transport: tr}
			resp, err := do(t, c, "POST", api+"/channels/1/messages", "Bot a")
			mustOK(t, resp, err)

			if n := mock.GetTotalCallCount(); n != 1 {
				t.Fatalf("%d requests reached the server; want 1", n)
			}
			retries, cancelled := st.record()
			if len(retries) != tc.claims || retries[0] || slices.Contains(retries[1:], false) {
				t.Fatalf("claims' Retry = %v; want %d claims, all but the first a retry's: a claim after a lapse keeps its place", retries, tc.claims)
			}
			if cancelled != tc.claims-1 {
				t.Fatalf("%d grants given back unsent; want %d", cancelled, tc.claims-1)
			}
			mu.Lock()
			defer mu.Unlock()
			lapsed := 0
			for _, e := range events {
				if e.Kind == ratecord.EventLapsed {
					lapsed++
					if e.Attempt != 1 || e.Route == "" || e.Kind.String() != "lapsed" {
						t.Errorf("event %+v; want attempt 1, a route, kind lapsed", e)
					}
				}
			}
			if lapsed != tc.events {
				t.Fatalf("%d EventLapsed; want %d (events %+v)", lapsed, tc.events, events)
			}
		})
	}
}

// TestGrantLapsedAtTheHandOff: a grant good when the transport checked it
// but lapsed by the time the base transport was to get the request (the
// process frozen in between) is checked again just before the hand-off:
// the request is not sent on it but claims again, with or without a
// context that can end (handed off from a goroutine of its own, or not).
func TestGrantLapsedAtTheHandOff(t *testing.T) {
	t.Parallel()
	for name, deadline := range map[string]bool{"no deadline": false, "deadline": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st := &lapsingStore{Store: memstore.New()}
			t.Cleanup(func() { st.Close() })
			// The first grant: good at the check, lapsed at the hand-off.
			st.answers = []bool{false, true}
			mock := lapseServer()
			var lapsed atomic.Int32
			tr := ratecord.NewTransport(mock, ratecord.WithStore(st), ratecord.WithEventHandler(func(e ratecord.Event) {
				if e.Kind == ratecord.EventLapsed {
					lapsed.Add(1)
				}
			}))
			t.Cleanup(func() { tr.Close() })
			ctx := t.Context()
			if deadline {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Minute)
				defer cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, "POST", api+"/channels/1/messages", nil)
			req.Header.Set("Authorization", "Bot a")
			resp, err := tr.RoundTrip(req)
			mustOK(t, resp, err)
			if n := mock.GetTotalCallCount(); n != 1 {
				t.Fatalf("%d requests reached the server; want 1", n)
			}
			retries, cancelled := st.record()
			if len(retries) != 2 || retries[0] || !retries[1] {
				t.Errorf("claims' Retry = %v; want two claims, the second a retry's", retries)
			}
			if cancelled != 1 {
				t.Errorf("%d grants given back unsent; want 1", cancelled)
			}
			if n := lapsed.Load(); n != 1 {
				t.Errorf("%d EventLapsed; want 1", n)
			}
		})
	}
}
