package memstore

import "github.com/ratecord/ratecord/store/internal/lane"

// queue is a line of waiters in grant order, in two lanes (see
// store/internal/lane): urgent ones ahead of normal ones, which keep a
// bounded share; by arrival within a lane.
type queue struct {
	w      []*waiter
	head   int
	streak int // urgent grants in a row
}

func (q *queue) empty() bool    { return q.head == len(q.w) }
func (q *queue) len() int       { return len(q.w) - q.head }
func (q *queue) front() *waiter { return q.w[q.head] }

func isUrgent(w *waiter) bool { return w.urgent }
func isRetry(w *waiter) bool  { return w.retry }

// push places w in its lane: at the back, or for a retry at the front (see
// lane.PlaceRetry).
func (q *queue) push(w *waiter) {
	if w.retry {
		q.w = lane.Insert(q.w, lane.PlaceRetry(q.w, q.head, w.urgent, isUrgent, isRetry), w)
		return
	}
	q.w = lane.Insert(q.w, lane.Place(q.w, q.head, w.urgent, isUrgent, q.streak), w)
}

// pop takes the front waiter, for a grant.
func (q *queue) pop() *waiter {
	w := q.w[q.head]
	q.streak = lane.Granted(q.streak, w.urgent)
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

// insert places w, which arrived earlier and moves from another line (its
// route learned its bucket), by its arrival sequence within its lane: ahead
// of the later waiters of its lane, and for an urgent one of every normal
// waiter behind it.
func (q *queue) insert(w *waiter) {
	i := len(q.w)
	for i > q.head && (q.w[i-1].seq > w.seq && q.w[i-1].urgent == w.urgent || w.urgent && !q.w[i-1].urgent) {
		i--
	}
	q.w = lane.Insert(q.w, i, w)
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
