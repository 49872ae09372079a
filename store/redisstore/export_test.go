package redisstore

import "time"

// ModelSource is the model the scripts share, for the transition tests.
var ModelSource = modelSource

// Froze has the Store's freeze watch record that the process did not run
// from from to to, as its ticker would after a real freeze.
func (s *Store) Froze(from, to time.Time) {
	s.freezes.mu.Lock()
	defer s.freezes.mu.Unlock()
	w := s.freezes
	w.gaps[w.next] = span{w.ns(from), w.ns(to)}
	w.next = (w.next + 1) % freezeGaps
}
