package redisstore

import (
	"context"
	"time"
)

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

// Held returns the sessions the Store keeps and the entries of its aged
// maps.
func (s *Store) Held() (sessions, remembered int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sessions), s.routes.len() + s.refusal.len()
}

// SetAgePeriod sets how often the aged maps of Stores created from now on
// age, until restore is called.
func SetAgePeriod(d time.Duration) (restore func()) {
	old := agePeriod
	agePeriod = d
	return func() { agePeriod = old }
}

// Aging reports whether the timer that ages the aged maps is armed.
func (s *Store) Aging() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.aging != nil
}

// Age ages the Store's aged maps as its timer does.
func (s *Store) Age() { s.age() }

// MaxAged bounds the entries of each aged map.
const MaxAged = maxAged

// Crowd is the number of sessions beyond which idle sessions end at once.
const Crowd = crowd

// EdgeKey and EdgeChannel are the key of the Store's shared gates and the
// channel of their notes.
func (s *Store) EdgeKey() string     { return s.edgeKey() }
func (s *Store) EdgeChannel() string { return s.edgeChannel() }

// GateRoutes reads the shared gates from Redis: each gate's key and the
// route its pace falls on.
func (s *Store) GateRoutes(ctx context.Context) (map[string]string, error) {
	v, err := edgeRemote{s}.run(ctx, "read")
	if err != nil {
		return nil, err
	}
	sts, err := parseEdgeStates(v)
	if err != nil {
		return nil, err
	}
	m := make(map[string]string, len(sts))
	for _, st := range sts {
		m[st.Key] = st.Paced
	}
	return m, nil
}

// Resyncs returns how many times every queue of the Store was made to ask
// Redis again: once when its subscription is first confirmed, and after
// each time it or Redis was lost.
func (s *Store) Resyncs() uint64 { return s.resyncs.Load() }
