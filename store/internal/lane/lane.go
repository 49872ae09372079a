// Package lane orders a line of waiters in two lanes: urgent requests go
// ahead of normal ones, but when both lanes wait, at most Overtake urgent
// grants come in a row before a normal one, so the normal lane (bulk work)
// keeps a bounded share and is never starved. Within a lane, arrival order
// holds. Both stores order their queues with it.
package lane

// Overtake is how many urgent grants may come in a row while normal
// requests wait: the normal lane keeps one slot in Overtake+1.
const Overtake = 4

// Place returns where in q[from:], a line in grant order, a waiter
// arriving now goes: the back for a normal one; for an urgent one, behind
// every urgent one and ahead of the first normal one whose turn has not
// come, counting streak, the urgent grants made in a row before q's front.
// urgent reports a waiter's lane.
func Place[T any](q []T, from int, isUrgent bool, urgent func(T) bool, streak int) int {
	if !isUrgent {
		return len(q)
	}
	run := streak
	for i := from; i < len(q); i++ {
		switch {
		case urgent(q[i]):
			run++
		case run >= Overtake:
			run = 0 // this normal waiter's turn
		default:
			return i
		}
	}
	return len(q)
}

// PlaceRetry returns where in q[from:] a retry goes, a waiter that was
// granted before and keeps its place: in its lane ahead of every waiter
// that is not a retry, behind the retries already there. For an urgent
// one, that is ahead of every waiter but the urgent retries; for a normal
// one, ahead of the first normal waiter that is not a retry. retry reports
// whether a waiter is a retry.
func PlaceRetry[T any](q []T, from int, isUrgent bool, urgent, retry func(T) bool) int {
	for i := from; i < len(q); i++ {
		u, r := urgent(q[i]), retry(q[i])
		if isUrgent && !(u && r) || !isUrgent && !u && !r {
			return i
		}
	}
	return len(q)
}

// Granted returns the streak after a grant to a waiter of the lane urgent.
func Granted(streak int, urgent bool) int {
	if urgent {
		return streak + 1
	}
	return 0
}

// Insert inserts v into q at i.
func Insert[T any](q []T, i int, v T) []T {
	var zero T
	q = append(q, zero)
	copy(q[i+1:], q[i:])
	q[i] = v
	return q
}
