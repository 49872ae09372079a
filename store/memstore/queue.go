package memstore

import "time"

// queue is a FIFO of waiters ordered by arrival.
type queue struct {
	w    []*waiter
	head int
}

func (q *queue) empty() bool    { return q.head == len(q.w) }
func (q *queue) len() int       { return len(q.w) - q.head }
func (q *queue) front() *waiter { return q.w[q.head] }
func (q *queue) push(w *waiter) { q.w = append(q.w, w) }

func (q *queue) pop() *waiter {
	w := q.w[q.head]
	q.w[q.head] = nil
	q.head++
	if q.head == len(q.w) {
		q.w, q.head = q.w[:0], 0
	} else if q.head > 64 && q.head > len(q.w)/2 {
		n := copy(q.w, q.w[q.head:])
		clear(q.w[n:])
		q.w, q.head = q.w[:n], 0
	}
	return w
}

// insert places w by its arrival sequence (usually at the back).
func (q *queue) insert(w *waiter) {
	i := len(q.w)
	for i > q.head && q.w[i-1].seq > w.seq {
		i--
	}
	q.w = append(q.w, nil)
	copy(q.w[i+1:], q.w[i:])
	q.w[i] = w
}

func (q *queue) remove(w *waiter) {
	for i := q.head; i < len(q.w); i++ {
		if q.w[i] == w {
			copy(q.w[i:], q.w[i+1:])
			q.w[len(q.w)-1] = nil
			q.w = q.w[:len(q.w)-1]
			return
		}
	}
}

// ring is the sliding log of a credential's global window: for each of its
// most recent grants, as many as the global limit, the latest moment the
// request may have reached Discord. That is the grant plus the claim's
// offset until the response arrives, then the response time if earlier.
//
// A grant is allowed while the log has room, or once its oldest entry has
// left the window. Entries lowered by settle or freed by remove may make the
// log slightly out of order; the check then waits on an entry that is not
// the earliest, which only ever errs on the side of waiting.
type ring struct {
	t      []time.Time // zero: a hole left by remove
	gen    []uint64    // generation of each slot's entry, for tokens
	head   int         // oldest entry when full
	n      int         // entries in use, holes included
	holes  int
	next_  uint64 // last generation handed out
	window time.Duration
}

const tokenPosShift = 40

func (r *ring) resize(limit int) {
	if limit == len(r.t) {
		return
	}
	var keep []time.Time
	for i := 0; i < r.n; i++ {
		if t := r.at(i); !t.IsZero() {
			keep = append(keep, t)
		}
	}
	keep = keep[max(0, len(keep)-limit):]
	r.t = make([]time.Time, limit)
	r.gen = make([]uint64, limit) // outstanding tokens no longer match
	r.n = copy(r.t, keep)
	r.head, r.holes = 0, 0
}

// at returns the i-th oldest entry.
func (r *ring) at(i int) time.Time { return r.t[(r.head+i)%len(r.t)] }

// next reports whether the log is full and, if so, when its oldest entry
// leaves the window.
func (r *ring) next(window time.Duration) (time.Time, bool) {
	if len(r.t) == 0 || r.n < len(r.t) || r.holes > 0 {
		return time.Time{}, false
	}
	return r.t[r.head].Add(window), true
}

// push records a grant whose request may reach Discord until bound, and
// returns its token (never 0).
func (r *ring) push(bound time.Time) uint64 {
	var pos int
	switch {
	case r.holes > 0:
		for i := 0; i < r.n; i++ {
			if p := (r.head + i) % len(r.t); r.t[p].IsZero() {
				pos = p
				break
			}
		}
		r.holes--
	case r.n < len(r.t):
		pos = (r.head + r.n) % len(r.t)
		r.n++
	default:
		pos = r.head
		r.head = (r.head + 1) % len(r.t)
	}
	r.t[pos] = bound
	r.next_++
	r.gen[pos] = r.next_
	return uint64(pos)<<tokenPosShift | r.next_&(1<<tokenPosShift-1)
}

// index returns where the grant with token tok is, if still in the log.
func (r *ring) index(tok uint64) (int, bool) {
	pos := int(tok >> tokenPosShift)
	if tok == 0 || pos >= len(r.t) || r.gen[pos]&(1<<tokenPosShift-1) != tok&(1<<tokenPosShift-1) || r.t[pos].IsZero() {
		return 0, false
	}
	return pos, true
}

// settle lowers the bound of grant tok to at, when its response arrived
// before the bound.
func (r *ring) settle(tok uint64, at time.Time) {
	if i, ok := r.index(tok); ok && at.Before(r.t[i]) {
		r.t[i] = at
	}
}

// remove frees the entry of a granted request that was not sent.
func (r *ring) remove(tok uint64) {
	if i, ok := r.index(tok); ok {
		r.t[i] = time.Time{}
		r.holes++
	}
}

func (r *ring) newest() (time.Time, bool) {
	var newest time.Time
	for i := 0; i < r.n; i++ {
		if t := r.at(i); t.After(newest) {
			newest = t
		}
	}
	return newest, !newest.IsZero()
}

// invalidLog counts invalid responses in slots of invalidSlot, a sliding
// window that errs on the side of counting too much (up to one slot longer
// than store.InvalidWindow). The sum is cached per slot, so counting is
// constant time.
type invalidLog struct {
	epoch time.Time
	slots [invalidSlots + 1]struct {
		n   int
		idx int64
	}
	sumIdx int64 // slot index the cached sum is for; -1 when stale
	sum    int
	oldest int64
}

const (
	invalidSlot  = 10 * time.Second
	invalidSlots = 60 // invalidSlots * invalidSlot = store.InvalidWindow
)

func (l *invalidLog) index(now time.Time) int64 { return int64(now.Sub(l.epoch) / invalidSlot) }

func (l *invalidLog) add(now time.Time) {
	i := l.index(now)
	s := &l.slots[i%int64(len(l.slots))]
	if s.idx != i {
		s.idx, s.n = i, 0
	}
	s.n++
	l.sumIdx = -1
}

// count returns the number of invalid responses in the window and when the
// oldest of them stops counting.
func (l *invalidLog) count(now time.Time) (int, time.Time) {
	cur := l.index(now)
	if cur != l.sumIdx {
		l.sum, l.oldest = 0, cur+1
		for _, s := range l.slots {
			if s.n > 0 && cur-s.idx <= invalidSlots {
				l.sum += s.n
				l.oldest = min(l.oldest, s.idx)
			}
		}
		l.sumIdx = cur
	}
	return l.sum, l.epoch.Add(time.Duration(l.oldest+invalidSlots+1) * invalidSlot)
}
