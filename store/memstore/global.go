package memstore

import (
	"math"
	"slices"
)

// window is a credential's global window: at most limit requests in any
// sliding window of length span. Each request counts from the latest moment
// it may have reached Discord: its grant plus the claim's offset until the
// response arrives, then the response time (later than the bound when the
// request left late: its goroutine was descheduled, or its connection took
// long to open). A request counts
// while that moment is later than now - span; a grant is allowed while
// fewer than limit requests count. Times are the store's milliseconds.
//
// Its size does not grow with the limit. Up to exactMax requests it keeps
// an exact log, one entry per request, which expires entries as they leave
// the window: the default limit of 50 is always exact, to the millisecond.
// Beyond exactMax it counts requests in time slices, a fixed array of 256
// counts (see sliced), and returns to the log once nothing counts any more.
//
// Grants return a token, which settle and remove use to find the request
// again. A token the window no longer recognises (the request left the
// window, or its entry was folded into a count) is ignored: the request
// then keeps counting from its grant plus offset, which only errs on the
// side of counting too much.
type window struct {
	log    []entry // exact mode: one entry per request that may count
	logMin int64   // at most the earliest moment in log, so that counting looks at it only when it must
	sl     *sliced // slice mode when not nil
	lastID uint64  // last entry id handed out
	epoch  uint64  // incremented each time slice mode starts, so stale slice tokens match nothing
	limit  int
	span   int64 // ms
}

// entry is one request of the exact log, or of the slices' overflow.
type entry struct {
	t  int64  // latest moment the request may have reached Discord
	id uint64 // its token
}

const (
	// exactMax is the most requests the exact log holds.
	exactMax = 64
	// perWindow is the number of slices a window spans: a request counts
	// from the end of its slice, at most width-1 ms late.
	perWindow = 128
	// sliceCount is the number of slices kept: one window behind now and,
	// for bounds of requests still in flight, about one window ahead. (A
	// power of two, for the modulo.)
	sliceCount = 2 * perWindow

	// A token with sliceToken set names a slice: the epoch above
	// tokenEpochShift, the slice index below it. Other tokens are entry ids.
	sliceToken      = 1 << 63
	tokenEpochShift = 40
	tokenIndexMask  = 1<<tokenEpochShift - 1
	tokenEpochMask  = 1<<(63-tokenEpochShift) - 1
)

// configure sets the limit and the span (ms) of the window at now. Claims
// of one credential normally agree on both; when a span grows, requests
// that had left the shorter window do not count again.
func (w *window) configure(now int64, limit int, span int64) {
	w.limit = limit
	if span != w.span && w.sl != nil {
		w.sl.expire(now)
		w.epoch = (w.epoch + 1) & tokenEpochMask // the old slices are gone
		w.sl.respan(now, span, w.epoch)
	}
	w.span = span
}

// counted returns how many requests count at now, dropping those that no
// longer do.
func (w *window) counted(now int64) int {
	if w.sl != nil {
		n := w.sl.counted(now)
		if n == 0 {
			w.sl = nil // back to the exact log, which is empty
		}
		return n
	}
	if cut := now - w.span; w.logMin <= cut {
		w.log, w.logMin = expire(w.log, cut)
		if len(w.log) == 0 {
			w.log = nil
		}
	}
	return len(w.log)
}

// expire removes the entries that count no longer at now (those at or
// before cut = now - span) from log, keeping the order of the others, and
// returns the earliest moment left (math.MaxInt64 for none).
func expire(log []entry, cut int64) ([]entry, int64) {
	out, earliest := log[:0], int64(math.MaxInt64)
	for _, e := range log {
		if e.t > cut {
			out = append(out, e)
			earliest = min(earliest, e.t)
		}
	}
	clear(log[len(out):])
	return out, earliest
}

// next reports whether the window is full at now and, if so, when a grant
// is allowed again (unless a request in flight answers earlier).
func (w *window) next(now int64) (int64, bool) {
	if w.limit <= 0 || (w.sl == nil && len(w.log) < w.limit) {
		return 0, false // fewer entries than the limit: none needs expiring
	}
	n := w.counted(now)
	if n < w.limit {
		return 0, false
	}
	// The moment the (n-limit+1)-th earliest request leaves the window.
	k := n - w.limit
	if w.sl != nil {
		return w.sl.kth(k) + w.span, true
	}
	var buf [exactMax]int64
	ts := buf[:0]
	for _, e := range w.log {
		ts = append(ts, e.t)
	}
	slices.Sort(ts)
	return ts[k] + w.span, true
}

// push records a grant at now whose request may reach Discord until bound,
// and returns its token (never 0).
func (w *window) push(now, bound int64) uint64 {
	if w.sl == nil && len(w.log) >= exactMax {
		w.counted(now)
		if len(w.log) >= exactMax {
			w.toSlices(now)
		}
	}
	w.lastID = (w.lastID + 1) & (sliceToken - 1)
	if w.lastID == 0 {
		w.lastID = 1
	}
	if w.sl != nil {
		return w.sl.add(now, entry{t: bound, id: w.lastID})
	}
	if len(w.log) == 0 {
		w.logMin = bound
	}
	w.log = append(w.log, entry{t: bound, id: w.lastID})
	w.logMin = min(w.logMin, bound)
	return w.lastID
}

// toSlices moves the exact log into slices.
func (w *window) toSlices(now int64) {
	w.epoch = (w.epoch + 1) & tokenEpochMask
	w.sl = newSliced(w.span, w.epoch)
	for _, e := range w.log {
		// Entries that land in a slice lose their token: if their request
		// answers early, they still count from their bound.
		w.sl.add(now, e)
	}
	w.log = nil
}

// settle moves the moment of the request with token tok to at, when its
// response arrived: earlier than its bound as a rule, later when the
// request left late, unless its bound left the window already (then the
// window may have granted its slot again: too late to count it).
func (w *window) settle(tok uint64, now, at int64) {
	if tok == 0 {
		return
	}
	if w.sl != nil {
		w.sl.settle(tok, now, at)
		return
	}
	if i := find(w.log, tok); i >= 0 && w.log[i].t > now-w.span {
		w.log[i].t = at
		w.logMin = min(w.logMin, at)
	}
}

// remove forgets the request with token tok, which was not sent.
func (w *window) remove(tok uint64) {
	if tok == 0 {
		return
	}
	if w.sl != nil {
		w.sl.remove(tok)
		return
	}
	if i := find(w.log, tok); i >= 0 {
		w.log = slices.Delete(w.log, i, i+1)
	}
}

// empty reports whether no request counts at now.
func (w *window) empty(now int64) bool { return w.counted(now) == 0 }

// find returns the index of the entry with id in log, which is in the
// order of ids (the order of grants), or -1.
func find(log []entry, id uint64) int {
	if len(log) > 0 && log[0].id == id {
		return 0 // requests mostly answer in the order they were granted
	}
	lo, hi := 0, len(log)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		switch {
		case log[m].id == id:
			return m
		case log[m].id < id:
			lo = m + 1
		default:
			hi = m
		}
	}
	return -1
}

// sliced counts requests in slices of width ms: slice i holds the requests
// whose moment t lies in ((i-1)*width, i*width], counted as if at
// i*width. A request thus counts at most width-1 ms longer than it should
// (t is a whole millisecond), never shorter. At the limit this is at most
// width-1 ms lost per window of span ms: with width = ceil(span/perWindow)
// utilisation stays above span/(span+width-1), 0.993 for a window of one
// second (width 8 ms) and 1 for windows up to perWindow ms (width 1 ms).
//
// Slices cover one window behind now and about one ahead; a request whose
// bound lies further ahead (an offset longer than the window) is kept as an
// exact entry in over until it settles or counts no longer, so over never
// holds more than the requests in flight. Like the exact log, over is in
// the order of grants, hence of ids.
type sliced struct {
	n      [sliceCount]uint32 // counts by slice index modulo sliceCount
	span   int64              // of the window
	width  int64
	behind int64 // slices behind now's that may count: ceil(span/width)+1
	lo, hi int64 // lowest and highest slice index that may hold a count; lo > hi when none does
	total  int   // sum of n
	over   []entry
	// overMin is at most the earliest moment in over (math.MaxInt64 when
	// over is empty), so that expire looks at over only when it must.
	overMin int64
	epoch   uint64
}

func newSliced(span int64, epoch uint64) *sliced {
	s := &sliced{lo: 1, hi: 0, overMin: math.MaxInt64, epoch: epoch}
	s.setWidth(span, max(1, ceilDiv(span, perWindow)))
	return s
}

func (s *sliced) setWidth(span, width int64) {
	s.span, s.width = span, width
	s.behind = ceilDiv(span, width) + 1
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// index returns the slice of moment t.
func (s *sliced) index(t int64) int64 {
	if s.width == 1 {
		return t
	}
	return ceilDiv(t, s.width)
}

// ahead returns the highest slice index a request may be added to at now.
func (s *sliced) ahead(now int64) int64 { return s.index(now) + sliceCount - 1 - s.behind }

// expire drops the slices and overflow entries that count no longer at now.
func (s *sliced) expire(now int64) {
	cut := now - s.span // slice i counts while i*width > cut
	if (s.lo > s.hi || s.lo*s.width > cut) && s.overMin > cut {
		return // nothing to drop
	}
	s.drop(cut)
}

func (s *sliced) drop(cut int64) {
	if s.lo <= s.hi && s.hi*s.width <= cut {
		s.n = [sliceCount]uint32{}
		s.lo, s.hi, s.total = 1, 0, 0
	}
	for s.lo <= s.hi && s.lo*s.width <= cut {
		c := &s.n[s.lo%sliceCount]
		s.total -= int(*c)
		*c = 0
		s.lo++
	}
	if s.overMin <= cut {
		s.over, s.overMin = expire(s.over, cut)
	}
}

// counted returns how many requests count at now.
func (s *sliced) counted(now int64) int {
	s.expire(now)
	return s.total + len(s.over)
}

// add records request e at now and returns its token.
func (s *sliced) add(now int64, e entry) uint64 {
	s.expire(now)
	i := s.index(e.t)
	if i*s.width <= now-s.span {
		return e.id // counts no longer: nothing to record
	}
	if i > s.ahead(now) {
		s.over = append(s.over, e)
		s.overMin = min(s.overMin, e.t)
		return e.id
	}
	s.count(i, 1)
	return sliceToken | s.epoch<<tokenEpochShift | uint64(i)&tokenIndexMask
}

// count adds c requests to slice i, which must lie within reach.
func (s *sliced) count(i int64, c uint32) {
	if s.lo > s.hi {
		s.lo, s.hi = i, i
	}
	s.lo, s.hi = min(s.lo, i), max(s.hi, i)
	s.n[i%sliceCount] += c
	s.total += int(c)
}

// slot returns the slice a token names, if it still holds a count.
func (s *sliced) slot(tok uint64) (int64, bool) {
	if tok&sliceToken == 0 || tok>>tokenEpochShift&tokenEpochMask != s.epoch {
		return 0, false
	}
	i := int64(tok & tokenIndexMask)
	if i < s.lo || i > s.hi || s.n[i%sliceCount] == 0 {
		return 0, false
	}
	return i, true
}

func (s *sliced) settle(tok uint64, now, at int64) {
	s.expire(now)
	if tok&sliceToken == 0 {
		if j := find(s.over, tok); j >= 0 && at != s.over[j].t {
			e := s.over[j]
			s.over = slices.Delete(s.over, j, j+1)
			e.t = at
			s.add(now, e)
		}
		return
	}
	i, ok := s.slot(tok)
	if !ok {
		return
	}
	j := s.index(at)
	if j == i {
		return
	}
	s.n[i%sliceCount]--
	s.total--
	if j*s.width > now-s.span {
		s.count(j, 1) // at <= now: within reach
	}
}

func (s *sliced) remove(tok uint64) {
	if tok&sliceToken == 0 {
		if j := find(s.over, tok); j >= 0 {
			s.over = slices.Delete(s.over, j, j+1)
		}
		return
	}
	if i, ok := s.slot(tok); ok {
		s.n[i%sliceCount]--
		s.total--
	}
}

// kth returns the moment of the k-th (from 0) earliest request counted;
// k must be less than the number counted.
func (s *sliced) kth(k int) int64 {
	over := make([]int64, 0, len(s.over))
	for _, e := range s.over {
		over = append(over, e.t)
	}
	slices.Sort(over)
	last := int64(0)
	for i := s.lo; i <= s.hi; i++ {
		t := i * s.width
		for len(over) > 0 && over[0] <= t {
			if k == 0 {
				return over[0]
			}
			k--
			over = over[1:]
		}
		c := int(s.n[i%sliceCount])
		if k < c {
			return t
		}
		k -= c
		if c > 0 {
			last = t
		}
	}
	if k < len(over) {
		return over[k]
	}
	return last
}

// respan keeps the slices right at now when the window's span changes to
// span (which is rare: claims of one credential that disagree). Their
// counts are folded into the latest slice in use, as if every request
// counted from its end (too much, never too little), under a width wide
// enough for that slice to stay within reach.
func (s *sliced) respan(now, span int64, epoch uint64) {
	s.epoch = epoch
	last, total := s.hi*s.width, s.total
	s.n = [sliceCount]uint32{}
	s.lo, s.hi, s.total = 1, 0, 0
	s.setWidth(span, max(1, ceilDiv(span, perWindow), ceilDiv(span+max(0, last-now), sliceCount-4)))
	if total > 0 {
		s.count(s.index(last), uint32(total))
	}
}
