package memstore

import (
	"hash/maphash"
	"math"

	"github.com/ratecord/ratecord/store/internal/model"
)

// Beyond the bound (see sweep.go), a credential whose routes were forgotten
// is dropped as soon as nothing of it is in flight or waiting. Two things
// of it may still matter to the limits for a while: the requests that still
// count in its global window, and a bucket with no slot left until its
// window resets. The store keeps them in a record of 8 bytes, keyed by a
// 64-bit digest of the credential (under a seed drawn for the store), so
// that a credential the bound forgot costs a few tens of bytes while its
// window lasts, however many arrive at once:
//
//   - its global window: n requests, the earliest counting from its own
//     moment, the n-1 others from the latest one. A request never counts
//     from earlier than its own moment: a credential folded at its global
//     limit may wait up to one window longer than exact, never less.
//   - the moment its exhausted buckets have a slot again. Which routes such
//     a bucket served is forgotten, so until then every bucket the
//     credential makes is paused: its next request waits at most that
//     bucket's reset.
//
// A bucket that has a slot free is forgotten without a trace: the next
// request of its route probes it again, alone, and the response says what
// is left, as for a route never seen. (A credential that then sends at once
// on k routes sharing such a bucket sends k probes: at most k-1 more than
// the bucket had left.)
//
// The next request of the credential builds it anew with the folded
// requests in its window, without tokens (none of them is in flight). The
// record stays until it lapses, and a credential folded again adds only the
// requests granted since. Two credentials that share a digest (about
// n²/2^65 for n at once) share a record: each then counts the other's
// requests too, and waits for the other's buckets, which errs only on the
// side of caution.

// fold is a record, packed in 64 bits:
//
//   - foldTime bits: the latest moment a folded request counts from (or
//     when the credential was folded, if none counts), in the store's
//     milliseconds modulo 2^foldTime. A record lives minutes, or a day at
//     most, far less than that; see last.
//   - foldGap bits: how much earlier the earliest request counts from. A
//     longer gap is cut, which makes that request count longer.
//   - foldCount bits: how many requests count.
//   - foldHold bits: how long after the latest moment the credential's
//     buckets wait, rounded up to foldMantissa significant bits.
type fold uint64

const (
	foldTime     = 32 // 49 days
	foldGap      = 12 // 4 s
	foldCount    = 7
	foldHold     = 64 - foldTime - foldGap - foldCount
	foldMantissa = 8 // the exponent takes the rest of foldHold
)

// makeFold packs n requests that count from moments in [first, last], and
// buckets that wait until until, folded at now (last <= now < until, or
// until 0 for none), or reports that they do not fit.
func makeFold(now, first, last int64, n int, until int64) (fold, bool) {
	if n == 0 {
		first, last = now, now
	}
	if n < 0 || n >= 1<<foldCount || last > now {
		return 0, false
	}
	gap := min(max(last-first, 0), 1<<foldGap-1)
	var hold uint64
	if until > now {
		// The smallest exponent that leaves a mantissa of foldMantissa
		// bits, the mantissa rounded up.
		d, e := uint64(until-last), uint64(0)
		for (d+1<<e-1)>>e >= 1<<foldMantissa {
			e++
		}
		m := (d + 1<<e - 1) >> e
		if e >= 1<<(foldHold-foldMantissa) {
			return 0, false
		}
		hold = e<<foldMantissa | m
	}
	return fold(uint64(last)&(1<<foldTime-1) | uint64(gap)<<foldTime | uint64(n)<<(foldTime+foldGap) |
		hold<<(foldTime+foldGap+foldCount)), true
}

// last returns the latest moment of f at now: the moment before now whose
// low foldTime bits f keeps.
func (f fold) last(now int64) int64 {
	return now - int64(uint32(now)-uint32(f))
}

func (f fold) first(now int64) int64 { return f.last(now) - int64(f>>foldTime&(1<<foldGap-1)) }
func (f fold) count() int            { return int(f >> (foldTime + foldGap) & (1<<foldCount - 1)) }

// until returns when the credential's buckets may go again (at or before
// last when they need not wait).
func (f fold) until(now int64) int64 {
	h := uint64(f >> (foldTime + foldGap + foldCount))
	m, e := h&(1<<foldMantissa-1), h>>foldMantissa
	return f.last(now) + int64(m<<e)
}

// end returns when f holds nothing any more, for a window of span.
func (f fold) end(now, span int64) int64 {
	if f.count() == 0 {
		return f.until(now)
	}
	return max(f.last(now)+span, f.until(now))
}

// digest names credential id in folds.
func (s *Store) digest(id string) uint64 { return maphash.String(s.seed, id) }

// fold drops cr, whose routes were forgotten, keeping what its limits
// still need in a record (see above), and reports whether it could:
// nothing of cr may be in flight or waiting, paused or cooling down, and
// each of its buckets must be droppable.
func (s *Store) fold(cr *cred, now int64) bool {
	if len(cr.routes) > 0 || len(cr.dead) > 0 || len(cr.subs) > 0 || len(cr.probes) > 0 ||
		!cr.globalQ.empty() || cr.alarm.armed() || now < cr.m.Pause || now < cr.m.Unauthorized {
		return false
	}
	until := cr.until
	for _, b := range cr.buckets {
		at, ok := b.droppable(now)
		if !ok {
			return false
		}
		until = max(until, at)
	}
	n, first, last, ok := cr.global.unfolded(now)
	if !ok {
		return false
	}
	if until <= now {
		until = 0
	}
	d := s.digest(cr.id)
	if old, had := s.folds[d]; had && old.end(now, s.span) > now {
		if old.count() > 0 && old.last(now) > now-s.span {
			if n == 0 {
				first, last = old.first(now), old.last(now)
			} else {
				first, last = min(first, old.first(now)), max(last, old.last(now))
			}
			n += old.count()
		}
		if u := old.until(now); u > now {
			until = max(until, u)
		}
	}
	if n == 0 && until == 0 {
		return s.drop(cr)
	}
	f, ok := makeFold(now, first, last, n, until)
	if !ok {
		return false
	}
	s.folds[d] = f
	s.foldsMin = min(s.foldsMin, f.end(now, s.span))
	return s.drop(cr)
}

// drop forgets cr and its buckets.
func (s *Store) drop(cr *cred) bool {
	for _, b := range cr.buckets {
		b.removed = true
	}
	s.nbuckets -= len(cr.buckets)
	delete(s.creds, cr.id)
	return true
}

// droppable reports whether b may be forgotten at now although its window
// may still be open, and until when its credential must then hold its
// requests (0: not at all). Nothing of b may be in flight or waiting, and
// no pause, hold or cap a 429 taught may be running; a slot must be free,
// or come back by time alone.
func (b *bucket) droppable(now int64) (int64, bool) {
	if !b.q.empty() || b.alarm.armed() || b.Pending > 0 || now < b.Pause ||
		b.Hold > 0 && now < b.HeldAt+b.Hold || b.Cap > 0 && now < b.CapAt+model.CapMemory {
		return 0, false
	}
	if b.Idle(now) || b.Available(now) {
		return 0, true
	}
	if at := b.WakeAt(now); at > now {
		return at, true
	}
	return 0, false
}

// unfold gives cr, just made, what a record keeps of its credential.
func (s *Store) unfold(cr *cred, now int64) {
	if len(s.folds) == 0 {
		return
	}
	if f, ok := s.folds[s.digest(cr.id)]; ok {
		cr.global.unfold(f, now, s.span)
		if until := f.until(now); until > now {
			cr.until = until
		}
	}
}

// sweepFolds forgets the records that lapsed by now. It looks at them at
// most every quarter of a window, so that each costs a few looks however
// often the store sweeps: a record outlives what it holds by that at most.
func (s *Store) sweepFolds(now int64) {
	if len(s.folds) == 0 || now < s.foldsMin || now-s.foldsSwept < s.span/4 {
		return
	}
	s.foldsSwept = now
	s.foldsPeak = max(s.foldsPeak, len(s.folds))
	s.foldsMin = math.MaxInt64
	for d, f := range s.folds {
		if end := f.end(now, s.span); end <= now {
			delete(s.folds, d)
		} else {
			s.foldsMin = min(s.foldsMin, end)
		}
	}
	s.foldsPeak = shrink(&s.folds, s.foldsPeak)
}

// unfolded returns the requests of w that count at now and carry a token
// (those granted since the credential was last made from a record): how
// many, and their earliest and latest moments. It reports false when w
// counts in slices, which are not folded.
func (w *window) unfolded(now int64) (n int, first, last int64, ok bool) {
	if w.sl != nil && w.counted(now) > 0 {
		return 0, 0, 0, false
	}
	w.counted(now)
	first = math.MaxInt64
	for _, e := range w.log {
		if e.id != 0 {
			n++
			first, last = min(first, e.t), max(last, e.t)
		}
	}
	return n, first, last, true
}

// unfold puts the requests of f that count at now into w, which is empty,
// as entries without a token (id 0, ahead of every token in id order).
func (w *window) unfold(f fold, now, span int64) {
	w.span = span
	cut := now - span
	if f.count() > 0 && f.first(now) > cut {
		w.log = append(w.log, entry{t: f.first(now)})
	}
	if f.count() > 1 && f.last(now) > cut {
		for range f.count() - 1 {
			w.log = append(w.log, entry{t: f.last(now)})
		}
	}
	if len(w.log) > 0 {
		w.logMin = w.log[0].t
	}
}
