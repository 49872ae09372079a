package memstore

import "github.com/ratecord/ratecord/internal/clock"

// WithClock injects the clock, for the tests of package memstore_test that
// drive a Transport.
func WithClock(c clock.Clock) Option { return withClock(c) }

// Entries returns how many credentials, routes and buckets s holds.
func (s *Store) Entries() (creds, routes, buckets int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.creds), s.nroutes, s.nbuckets
}
