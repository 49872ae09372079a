package memstore

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
