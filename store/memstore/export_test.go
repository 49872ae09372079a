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

// Folded returns how many credentials s keeps as records (see fold.go),
// and how many of those hold their buckets.
func (s *Store) Folded() (folds, held int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	for _, f := range s.folds {
		if f.until(now) > now {
			held++
		}
	}
	return len(s.folds), held
}
