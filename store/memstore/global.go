package memstore

// ring is the sliding log of a credential's global window: for each of its
// most recent grants, as many as the global limit, the latest moment (in the store's milliseconds) the
// request may have reached Discord. That is the grant plus the claim's
// offset until the response arrives, then the response time if earlier.
//
// A grant is allowed while the log has room, or once its oldest entry has
// left the window. Entries lowered by settle or freed by remove may make the
// log slightly out of order; the check then waits on an entry that is not
// the earliest, which only ever errs on the side of waiting.
type ring struct {
	t      []int64  // zero: a hole left by remove
	gen    []uint64 // generation of each slot's entry, for tokens
	head   int      // oldest entry when full
	n      int      // entries in use, holes included
	holes  int
	next_  uint64 // last generation handed out
	window int64  // ms
}

const tokenPosShift = 40

func (r *ring) resize(limit int) {
	if limit == len(r.t) {
		return
	}
	var keep []int64
	for i := 0; i < r.n; i++ {
		if t := r.at(i); t != 0 {
			keep = append(keep, t)
		}
	}
	keep = keep[max(0, len(keep)-limit):]
	r.t = make([]int64, limit)
	r.gen = make([]uint64, limit) // outstanding tokens no longer match
	r.n = copy(r.t, keep)
	r.head, r.holes = 0, 0
}

// at returns the i-th oldest entry.
func (r *ring) at(i int) int64 { return r.t[(r.head+i)%len(r.t)] }

// next reports whether the log is full and, if so, when its oldest entry
// leaves the window.
func (r *ring) next(window int64) (int64, bool) {
	if len(r.t) == 0 || r.n < len(r.t) || r.holes > 0 {
		return 0, false
	}
	return r.t[r.head] + window, true
}

// push records a grant whose request may reach Discord until bound, and
// returns its token (never 0).
func (r *ring) push(bound int64) uint64 {
	var pos int
	switch {
	case r.holes > 0:
		for i := 0; i < r.n; i++ {
			if p := (r.head + i) % len(r.t); r.t[p] == 0 {
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
	if tok == 0 || pos >= len(r.t) || r.gen[pos]&(1<<tokenPosShift-1) != tok&(1<<tokenPosShift-1) || r.t[pos] == 0 {
		return 0, false
	}
	return pos, true
}

// settle lowers the bound of grant tok to at, when its response arrived
// before the bound.
func (r *ring) settle(tok uint64, at int64) {
	if i, ok := r.index(tok); ok && at < r.t[i] {
		r.t[i] = at
	}
}

// remove frees the entry of a granted request that was not sent.
func (r *ring) remove(tok uint64) {
	if i, ok := r.index(tok); ok {
		r.t[i] = 0
		r.holes++
	}
}

func (r *ring) newest() (int64, bool) {
	var newest int64
	for i := 0; i < r.n; i++ {
		if t := r.at(i); t > newest {
			newest = t
		}
	}
	return newest, newest != 0
}
