package memstore

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"unsafe"
)

// refWindow is the global window kept exactly: every request with the
// moment it counts from.
type refWindow struct {
	t     map[uint64]int64
	limit int
	span  int64
}

func (r *refWindow) counted(now int64) int {
	n := 0
	for _, t := range r.t {
		if t > now-r.span {
			n++
		}
	}
	return n
}

func (r *refWindow) next(now int64) (int64, bool) {
	var ts []int64
	for _, t := range r.t {
		if t > now-r.span {
			ts = append(ts, t)
		}
	}
	if len(ts) < r.limit {
		return 0, false
	}
	slices.Sort(ts)
	return ts[len(ts)-r.limit] + r.span, true
}

// TestWindowNeverCountsTooLittle drives the window and an exact reference
// with the same random grants, responses and unsent requests, and checks
// that the window is full whenever the reference is, and opens no earlier.
func TestWindowNeverCountsTooLittle(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit int
		span  int64
	}{
		{3, 1000}, {50, 1000}, {exactMax, 1000}, {exactMax + 1, 1000}, {200, 1000},
		{1000, 1000}, {20000, 1000}, {500, 10}, {500, 100}, {5000, 60_000},
	} {
		t.Run(fmt.Sprintf("%d per %dms", tc.limit, tc.span), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(tc.limit), uint64(tc.span)))
			var w window
			ref := refWindow{t: map[uint64]int64{}, limit: tc.limit, span: tc.span}
			type flight struct {
				tok, id uint64
			}
			var inFlight []flight
			var lastID uint64
			// Requests whose entries were folded into counts (the log
			// turned into slices, or the slices were respanned) keep
			// counting from their bound: the window cannot find them.
			// (Those the slices keep apart, in over, keep their token.)
			folded := map[uint64]bool{}
			fold := func() {
				for _, f := range inFlight {
					if w.sl == nil || find(w.sl.over, f.tok) < 0 {
						folded[f.id] = true
					}
				}
			}
			now := int64(3_600_000)
			w.configure(now, tc.limit, tc.span)
			check := func(what string) {
				t.Helper()
				at, full := w.next(now)
				rat, rfull := ref.next(now)
				if rfull && (!full || at < rat) {
					t.Fatalf("at %d after %s: window next = %d, %v; the exact window is full until %d", now, what, at, full, rat)
				}
			}
			steps := 20_000
			if tc.limit >= 1000 {
				steps = 2_000
			}
			for range steps {
				switch op := rng.IntN(10); {
				case op < 5: // grants, as many as allowed and wanted
					// (A response later than its bound may have made more
					// than the limit count: the slots were granted before
					// it came. The window must not add to them.)
					counted := ref.counted(now)
					for n := rng.IntN(tc.limit/4 + 2); n > 0; n-- {
						if _, full := w.next(now); full {
							break
						}
						if counted++; counted > tc.limit {
							t.Fatalf("at %d: the window grants a request while %d count; want at most %d", now, counted, tc.limit)
						}
						offset := int64(250)
						if rng.IntN(8) == 0 {
							offset = rng.Int64N(3 * tc.span)
						}
						epoch := w.epoch
						tok := w.push(now, now+offset)
						if w.epoch != epoch {
							fold()
						}
						if tok == 0 {
							t.Fatalf("push returned token 0")
						}
						lastID++
						ref.t[lastID] = now + offset
						inFlight = append(inFlight, flight{tok, lastID})
					}
					check("grants")
				case op < 8 && len(inFlight) > 0: // a response, early or late
					i := rng.IntN(len(inFlight))
					f := inFlight[i]
					inFlight = slices.Delete(inFlight, i, i+1)
					w.settle(f.tok, now, now)
					if ref.t[f.id] > now-ref.span && !folded[f.id] {
						// It counts from its response, earlier or later
						// than its bound, unless it had left the window
						// or was folded into a slice.
						ref.t[f.id] = now
					}
					check("a response")
				case op < 9 && len(inFlight) > 0: // not sent
					i := rng.IntN(len(inFlight))
					f := inFlight[i]
					inFlight = slices.Delete(inFlight, i, i+1)
					w.remove(f.tok)
					delete(ref.t, f.id)
					check("an unsent request")
				case op == 9 && rng.IntN(50) == 0:
					// Claims that disagree on the span, which is rare.
					// Requests that left the window before it grew do not
					// count again.
					for id, at := range ref.t {
						if at <= now-ref.span {
							delete(ref.t, id)
						}
					}
					ref.span = []int64{tc.span, 2 * tc.span, tc.span/2 + 1}[rng.IntN(3)]
					epoch := w.epoch
					w.configure(now, tc.limit, ref.span)
					if w.epoch != epoch {
						fold()
					}
					check("a new span")
				default:
					now += rng.Int64N(tc.span/8 + 2)
					check("time passing")
				}
				for id, at := range ref.t {
					if at <= now-2*tc.span {
						delete(ref.t, id) // counts no longer, and never will again
					}
				}
			}
		})
	}
}

// TestWindowUtilization fills the window as fast as it allows, each
// request answered after latency, and compares what it grants with an
// exact window: the slices count a request at most width-1 ms late.
func TestWindowUtilization(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		limit   int
		span    int64
		latency int64
	}{
		{50, 1000, 0}, {50, 1000, 100}, {20000, 1000, 0}, {20000, 1000, 100}, {1000, 100, 20}, {5000, 1000, 400},
	} {
		t.Run(fmt.Sprintf("%d per %dms, %dms latency", tc.limit, tc.span, tc.latency), func(t *testing.T) {
			t.Parallel()
			got := fill(newWindowLimiter(tc.limit, tc.span), tc.span, tc.latency)
			want := fill(&fifoLimiter{limit: tc.limit, span: tc.span}, tc.span, tc.latency)
			u := float64(got) / float64(want)
			if u < 0.99 || got > want {
				t.Errorf("granted %d where an exact window grants %d: utilization %.4f; want at least 0.99, at most 1", got, want, u)
			}
			t.Logf("granted %d of %d: utilization %.4f", got, want, u)
		})
	}
}

// limiter is a global window as fill drives it.
type limiter interface {
	full(now int64) bool
	push(now, bound int64) uint64
	settle(tok uint64, now int64)
}

type windowLimiter struct{ w window }

func newWindowLimiter(limit int, span int64) *windowLimiter {
	l := &windowLimiter{}
	l.w.configure(3_600_000, limit, span)
	return l
}

func (l *windowLimiter) full(now int64) bool {
	_, full := l.w.next(now)
	return full
}
func (l *windowLimiter) push(now, bound int64) uint64 { return l.w.push(now, bound) }
func (l *windowLimiter) settle(tok uint64, now int64) { l.w.settle(tok, now, now) }

// fifoLimiter is an exact window for requests answered in the order they
// were granted, as fill answers them: those in flight count from their
// bound, in grant order; those answered from their response, in the
// order of the responses.
type fifoLimiter struct {
	limit    int
	span     int64
	answered []int64 // response moments, ascending
	flying   []int64 // bounds, ascending
	ids      []uint64
	lastID   uint64
}

func (f *fifoLimiter) full(now int64) bool {
	for len(f.answered) > 0 && f.answered[0] <= now-f.span {
		f.answered = f.answered[1:]
	}
	for len(f.flying) > 0 && f.flying[0] <= now-f.span {
		f.flying, f.ids = f.flying[1:], f.ids[1:]
	}
	return len(f.answered)+len(f.flying) >= f.limit
}

func (f *fifoLimiter) push(now, bound int64) uint64 {
	f.lastID++
	f.flying, f.ids = append(f.flying, bound), append(f.ids, f.lastID)
	return f.lastID
}

func (f *fifoLimiter) settle(tok uint64, now int64) {
	if len(f.ids) > 0 && f.ids[0] == tok {
		f.flying, f.ids = f.flying[1:], f.ids[1:]
		f.answered = append(f.answered, now)
	}
}

// fill grants as fast as l allows for 20 spans, one millisecond at a time,
// each request answered latency ms after its grant, and returns how many
// it granted.
func fill(l limiter, span, latency int64) int {
	type flight struct {
		tok uint64
		at  int64
	}
	var inFlight []flight
	granted := 0
	now := int64(3_600_000)
	for end := now + 20*span; now < end; now++ {
		for len(inFlight) > 0 && inFlight[0].at <= now {
			l.settle(inFlight[0].tok, now)
			inFlight = inFlight[1:]
		}
		for !l.full(now) {
			inFlight = append(inFlight, flight{l.push(now, now+250), now + latency})
			granted++
		}
	}
	return granted
}

// TestWindowSizeIndependentOfLimit checks that a window at a limit of
// 20,000 requests per second, used to the full, holds no more memory than
// one at the default 50.
func TestWindowSizeIndependentOfLimit(t *testing.T) {
	t.Parallel()
	size := func(limit int) uintptr {
		var w window
		now := int64(3_600_000)
		w.configure(now, limit, 1000)
		for end := now + 5000; now < end; now++ {
			for {
				if _, full := w.next(now); full {
					break
				}
				w.settle(w.push(now, now+250), now, now)
			}
		}
		n := unsafe.Sizeof(w) + uintptr(cap(w.log))*unsafe.Sizeof(entry{})
		if w.sl != nil {
			n += unsafe.Sizeof(*w.sl) + uintptr(cap(w.sl.over))*unsafe.Sizeof(entry{})
		}
		return n
	}
	small, large := size(50), size(20000)
	if large > 2*exactMax*unsafe.Sizeof(entry{})+unsafe.Sizeof(window{})+unsafe.Sizeof(sliced{}) || large > 2*small {
		t.Errorf("a window at 20,000/s holds %d bytes, at 50/s %d; want the same order", large, small)
	}
	t.Logf("window at 50/s: %d bytes; at 20,000/s: %d bytes", small, large)
}
