package redisstore

import (
	"strings"
	"time"

	"github.com/ratecord/ratecord/store"
)

// Recalls. Redis grants a bucket's slots by what the last responses said;
// a response may then show that the bucket holds fewer: a 429 pauses it
// (the limit was lowered, or another process's request got there first),
// or headers name a lower limit than the grants out assumed. A grant of
// that bucket that has not left its process yet would meet the same 429.
// So the grant is taken back: [Store.Lapsed] reports it lapsed, and the
// transport gives it back and claims again, at the front of its line.
//
//   - The process that read the response takes back its own grants of the
//     line at once, on a 429 (recallOwn), before Redis has seen the
//     report.
//   - Redis, applying any report that left a bucket with grants out paused
//     or over-granted, publishes "<tag> <line>" on recallChannel() (at
//     most once per line and call), and every process takes back its
//     grants of that line from calls that left before the note came. The
//     note leaves only once Redis has the new state, so the claims that
//     follow see it.
//
// A grant made by a call that left before the note but ran after the
// report is taken back too, at the cost of a claim. A note that is lost
// costs what it would have saved: the 429 the grant then meets is a
// response like any other.

// recallChannel is the channel of recalls, one for every process of the
// prefix.
func (s *Store) recallChannel() string { return s.channelPrefix() + "!" }

// globalRecall is the line of a recall of every grant that counts against
// the global limit: a global 429.
const globalRecall = "*"

// maxRecalls bounds the lines a session remembers recalls of; recalls
// older than a second are dropped first (a grant lapses well before).
const maxRecalls = 64

// recallLocked marks the grants of line that ss handed out from calls that
// left before at as taken back; s.mu must be held.
func (s *Store) recallLocked(ss *session, line string, at time.Time) {
	if ss.recalls == nil {
		ss.recalls = make(map[string]time.Time)
	}
	if _, ok := ss.recalls[line]; !ok && len(ss.recalls) >= maxRecalls {
		for k, t := range ss.recalls {
			if at.Sub(t) > time.Second {
				delete(ss.recalls, k)
			}
		}
		if len(ss.recalls) >= maxRecalls {
			return // a burst of recalls of many lines: the grants meet their 429s
		}
	}
	ss.recalls[line] = at
	if n := at.UnixNano(); n > s.lastRecall.Load() {
		s.lastRecall.Store(n)
	}
}

// recallOwn takes back, at now, the grants of this process that a 429
// reported for h spends: those of its line, or for a global 429 every
// grant that counts against the global limit. A 429 of a shared resource
// or a block holds something else (the gates hold those). s.mu must be
// held.
func (s *Store) recallOwn(ss *session, h *permit, u *store.Update, now time.Time) {
	if !u.Sent || u.Status != 429 {
		return
	}
	switch u.Scope {
	case store.ScopeShared, store.ScopeBlocked:
	case store.ScopeGlobal:
		s.recallLocked(ss, globalRecall, now)
	default:
		s.recallLocked(ss, h.line, now)
		if u.Bucket != "" {
			if l := learnedID(u.Bucket, h.major); l != h.line {
				s.recallLocked(ss, l, now)
			}
		}
	}
}

// recallNote applies a note of recallChannel: "<tag> <line>".
func (s *Store) recallNote(payload string) {
	tag, line, ok := strings.Cut(payload, " ")
	if !ok || tag == "" || line == "" || strings.Contains(line, " ") {
		return
	}
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	if ss := s.byTag[tag]; ss != nil {
		s.recallLocked(ss, line, now)
	}
}

// recalled reports whether grant h was taken back: a recall of its line
// (or, for a grant that counts against the global limit, of the global
// window) came after the call that granted it left.
func (s *Store) recalled(h *permit) bool {
	if h.granted.IsZero() || s.lastRecall.Load() < h.granted.UnixNano() {
		return false // no recall since: the common case, without the lock
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[h.cred]
	if ss == nil {
		return false
	}
	if at, ok := ss.recalls[h.line]; ok && !at.Before(h.granted) {
		return true
	}
	if at, ok := ss.recalls[globalRecall]; ok && h.global && !at.Before(h.granted) {
		return true
	}
	return false
}
