package redisstore

import (
	"math"
	"time"
)

// What a Store remembers in its process about credentials and routes
// (their hashes, the windows they showed, the cooldowns Redis reported) is
// a cache of what Redis holds: losing an entry costs at most one more
// round trip or a more cautious hold-off, never a wrong grant. So it is
// kept in aged maps, which forget what nobody used for a while and hold a
// bounded number of entries: a proxy that relays the tokens of many users
// gives back the memory of those gone idle within a minute, however many
// came.

// maxAged bounds the entries of each aged map.
const maxAged = 1 << 16

// agePeriod is how often the aged maps age: an entry goes between one and
// two periods after its last use. (A variable for the tests.)
var agePeriod = 25 * time.Second

// aged is a map in two generations: entries are put in cur; each period,
// or when cur holds half the bound, old is dropped and cur becomes old; a
// lookup that finds an entry in old moves it back to cur. Dropping a whole
// map, not clearing it, is what gives its memory back: a Go map keeps its
// size once grown. Guarded by Store.mu.
type aged[V any] struct {
	cur, old map[string]V
}

// get returns the value of key, keeping it for another period.
func (a *aged[V]) get(key string) (V, bool) {
	if v, ok := a.cur[key]; ok {
		return v, true
	}
	v, ok := a.old[key]
	if ok {
		delete(a.old, key)
		a.put(key, v)
	}
	return v, ok
}

// peek returns the value of key without keeping it longer.
func (a *aged[V]) peek(key string) (V, bool) {
	if v, ok := a.cur[key]; ok {
		return v, true
	}
	v, ok := a.old[key]
	return v, ok
}

// put sets the value of key.
func (a *aged[V]) put(key string, v V) {
	if _, ok := a.cur[key]; !ok {
		delete(a.old, key)
		if len(a.cur) >= maxAged/2 {
			a.roll()
		}
		if a.cur == nil {
			a.cur = make(map[string]V)
		}
	}
	a.cur[key] = v
}

// del forgets key.
func (a *aged[V]) del(key string) {
	delete(a.cur, key)
	delete(a.old, key)
}

// roll drops old and makes cur old.
func (a *aged[V]) roll() {
	a.old, a.cur = a.cur, nil
}

// len returns the number of entries held.
func (a *aged[V]) len() int { return len(a.cur) + len(a.old) }

// routeFacts is what a Store remembers of a route of a credential.
type routeFacts struct {
	hash   string        // the route's last known bucket hash ("": unknown; noBucket: none)
	window time.Duration // the longest window or pause seen on it, up to maxHold (0: none)
	limit  int32         // the limit its headers last named (0: none yet)
}

// setLimit records limit (ignored unless positive) and reports whether
// it changed f.
func (f *routeFacts) setLimit(limit int64) bool {
	l := int32(min(limit, math.MaxInt32))
	if l <= 0 || l == f.limit {
		return false
	}
	f.limit = l
	return true
}

// remember arms the timer that ages the Store's maps, unless it is armed;
// s.mu must be held.
func (s *Store) remember() {
	if s.aging != nil || s.closed {
		return
	}
	s.aging = time.AfterFunc(s.ageEvery, s.age)
}

// age rolls the Store's aged maps, and arms the timer again while they
// hold anything.
func (s *Store) age() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.aging = nil
	if s.closed {
		return
	}
	s.routes.roll()
	s.refusal.roll()
	if s.routes.len()+s.refusal.len() > 0 {
		s.remember()
	}
}
