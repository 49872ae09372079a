package memstore

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/ratecord/ratecord/internal/clock"
	"github.com/ratecord/ratecord/store"
)

// TestFoldPacks checks that a record keeps its latest moment and count
// exactly, and its earliest moment and hold never earlier than given (the
// hold within a 128th).
func TestFoldPacks(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	for range 100_000 {
		now := int64(3_600_000) + rng.Int64N(1<<40)
		last := now - rng.Int64N(2000)
		first := last - rng.Int64N(6000)
		n := rng.IntN(1 << foldCount)
		var until int64
		if rng.IntN(2) == 0 {
			until = now + 1 + rng.Int64N(int64([]int{1000, 60_000, 86_400_000}[rng.IntN(3)]))
		}
		f, ok := makeFold(now, first, last, n, until)
		if !ok {
			t.Fatalf("makeFold(%d, %d, %d, %d, %d) does not fit", now, first, last, n, until)
		}
		if n == 0 {
			first, last = now, now
		}
		// Read back at any moment of the record's life.
		at := now + rng.Int64N(2*86_400_000)
		if got := f.last(at); got != last {
			t.Fatalf("last = %d; want %d", got, last)
		}
		if got := f.count(); got != n {
			t.Fatalf("count = %d; want %d", got, n)
		}
		if got := f.first(at); got < first || got > last || last-first < 1<<foldGap && got != first {
			t.Fatalf("first = %d; want %d (no earlier, exact within %d ms of last %d)", got, first, 1<<foldGap, last)
		}
		if got := f.until(at); until > now && (got < until || got-until > (until-last)/128+1) {
			t.Fatalf("until = %d; want %d, at most a 128th later (last %d)", got, until, last)
		} else if until == 0 && got > last {
			t.Fatalf("until = %d with no hold; want at most last %d", got, last)
		}
	}
	if _, ok := makeFold(1000, 0, 1000, 1<<foldCount, 0); ok {
		t.Errorf("makeFold packs %d requests; want it to refuse", 1<<foldCount)
	}
}

// forget drops the routes of credential id and folds it, as a sweep beyond
// the bound does, and reports whether it is gone.
func forget(s *Store, id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	cr := s.creds[id]
	if cr == nil {
		return true
	}
	s.sweepCred(cr, now)
	for name := range cr.routes {
		delete(cr.routes, name)
		s.nroutes--
	}
	if cr.empty(now) {
		delete(s.creds, id)
		return true
	}
	return s.fold(cr, now)
}

// TestFoldedWindowNeverCountsTooLittle sends global requests of a few
// credentials at random moments, folding them at random, and checks
// against an exact log that no window of the limit's length ever holds
// more than the limit, and that a credential goes again once nothing of it
// counts.
func TestFoldedWindowNeverCountsTooLittle(t *testing.T) {
	t.Parallel()
	const limit, creds = 3, 4
	span := time.Second.Milliseconds()
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(seed, 7))
			s, clk := newFake(t)
			sent := make([][]int64, creds) // when each request counts from, by credential
			folds := 0
			for range 3000 {
				i := rng.IntN(creds)
				id := fmt.Sprintf("cred-%d", i)
				switch op := rng.IntN(10); {
				case op < 5:
					c := claim("POST /channels/:id/messages", fmt.Sprintf("channels/%d", rng.IntN(3)))
					c.Credential, c.Global, c.GlobalLimit, c.NoWait = id, true, limit, true
					now := s.now()
					counted := 0
					for _, at := range sent[i] {
						if at > now-span {
							counted++
						}
					}
					p, err := s.Acquire(t.Context(), c)
					if err != nil {
						var we *store.WaitError
						if !errors.As(err, &we) {
							t.Fatalf("Acquire = %v; want a grant or a WaitError", err)
						}
						if counted == 0 {
							t.Fatalf("at %d %s may not go (%v) although none of its requests counts", now, id, err)
						}
						continue
					}
					if counted >= limit {
						t.Fatalf("at %d %s went with %d requests in its window; want at most %d", now, id, counted, limit)
					}
					clk.Advance(time.Duration(rng.IntN(3)) * time.Millisecond)
					update(t, s, p, headers(c, "h", 1000, 999, time.Hour))
					sent[i] = append(sent[i], s.now())
				case op < 7:
					if forget(s, id) {
						folds++
					}
				default:
					clk.Advance(time.Duration(rng.Int64N(span/2)) * time.Millisecond)
				}
			}
			if folds < 100 {
				t.Errorf("%d folds; want many", folds)
			}
		})
	}
}

// TestFoldHoldsExhaustedBucket folds a credential whose bucket has no slot
// left for 5 s: its next request, on another route, waits for that reset.
// One whose bucket has slots left, and no global request, leaves no record
// and goes at once.
func TestFoldHoldsExhaustedBucket(t *testing.T) {
	t.Parallel()
	s, clk := newFake(t)
	c := claim("PUT /channels/:id/messages/:id/reactions/:reaction/@me", "channels/1")
	c.Credential = "spent"
	update(t, s, acquire(t, s, c), headers(c, "r", 1, 0, 5*time.Second))
	free := c
	free.Credential = "free"
	update(t, s, acquire(t, s, free), headers(free, "r", 5, 4, 5*time.Second))
	for _, id := range []string{"spent", "free"} {
		if !forget(s, id) {
			t.Fatalf("%s not folded", id)
		}
	}
	s.mu.Lock()
	folds := len(s.folds)
	s.mu.Unlock()
	if folds != 1 {
		t.Errorf("%d records; want 1, for the exhausted bucket", folds)
	}

	free.Route, free.Major = "GET /users/@me", ""
	update(t, s, acquire(t, s, free), sent(free, 200))

	other := free
	other.Credential = "spent"
	d, err := s.Estimate(t.Context(), other)
	if err != nil || d < 5*time.Second-time.Millisecond || d > 5*time.Second+50*time.Millisecond {
		t.Errorf("Estimate after the fold = %v, %v; want the bucket's reset, 5s", d, err)
	}
	other.NoWait = true
	if _, err := s.Acquire(t.Context(), other); !errors.Is(err, store.ErrWaitTooLong) {
		t.Errorf("Acquire before the reset = %v; want ErrWaitTooLong", err)
	}
	clk.Advance(5*time.Second + 50*time.Millisecond)
	update(t, s, acquire(t, s, other), sent(other, 200))
}

// TestFoldAddsOnlyNewRequests folds a credential, brings it back with two
// more requests, and folds it again: the record counts the three once.
func TestFoldAddsOnlyNewRequests(t *testing.T) {
	t.Parallel()
	clk := clock.NewFake(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s := New(withClock(clk))
	t.Cleanup(func() { s.Close() })
	c := claim("POST /channels/:id/messages", "channels/1")
	c.Global, c.GlobalLimit = true, 5
	for i := range 3 {
		if i > 0 {
			clk.Advance(100 * time.Millisecond)
			forget(s, "bot")
		}
		update(t, s, acquire(t, s, c), headers(c, "h", 100, 99, time.Hour))
	}
	forget(s, "bot")
	s.mu.Lock()
	f, ok := s.folds[s.digest("bot")]
	s.mu.Unlock()
	if !ok || f.count() != 3 {
		t.Fatalf("record %v, %v; want 3 requests", f.count(), ok)
	}
	// Two more may go, not three.
	c.NoWait = true
	for range 2 {
		update(t, s, acquire(t, s, c), headers(c, "h", 100, 99, time.Hour))
	}
	if _, err := s.Acquire(t.Context(), c); !errors.Is(err, store.ErrWaitTooLong) {
		t.Errorf("6th request in the window = %v; want ErrWaitTooLong", err)
	}
}
