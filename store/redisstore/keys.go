package redisstore

import (
	"crypto/sha256"
	"encoding/hex"
)

// noBucket is the value the routes hash holds for a route that answers
// without rate-limit headers. It cannot be a bucket hash sent by Discord.
const noBucket = "\x00"

// Bucket kinds, as the scripts number them.
const (
	kindLearned  = 0  // a learned (hash, major) counter
	kindProbe    = 1  // the probe of a (route, major) whose hash is unknown
	kindNone     = 2  // the credential's bucket for routes without one
	kindNoPermit = -1 // an update without a permit of this Store
)

// digest returns a short hex SHA-256 digest of the parts joined by NUL.
func digest(parts ...string) string {
	h := sha256.New()
	for i, p := range parts {
		if i > 0 {
			h.Write([]byte{0})
		}
		h.Write([]byte(p))
	}
	var sum [sha256.Size]byte
	return hex.EncodeToString(h.Sum(sum[:0])[:16])
}

// credKeys names the keys of one credential. Every key shares the hash tag
// {digest(credential)}, so all of them live in one Redis Cluster slot.
type credKeys struct {
	base string // "<prefix>:{<tag>}:"
}

func (s *Store) keysOf(credential string) credKeys {
	return s.keysOfTag(digest(credential))
}

// keysOfTag names the keys of the credential whose hash tag is tag.
func (s *Store) keysOfTag(tag string) credKeys {
	return credKeys{base: s.prefix + ":{" + tag + "}:"}
}

// channelPrefix is what the channel of each process starts with: the
// scripts push to channelPrefix() + the process's id (see notes.go).
func (s *Store) channelPrefix() string { return s.prefix + ":n:" }

func (k credKeys) routes() string { return k.base + "r" }
func (k credKeys) cred() string   { return k.base + "c" }
func (k credKeys) global() string { return k.base + "g" }
func (k credKeys) probes() string { return k.base + "m" }

// proc holds what the scripts know of the process whose Store has id
// proc: the numbers of its last call and report applied, and what that
// call granted.
func (k credKeys) proc(proc string) string { return k.base + "p:" + proc }

// dead is the cooldown key of a token-authenticated major.
func (k credKeys) dead(major string) string { return k.base + "d:" + digest(major) }

// sublimit holds, while it lives, the turn and the hidden sublimit of the
// requests of one kind on one route and major; sid is digest(route,
// major, kind) (see store.Claim.Kind).
func (k credKeys) sublimit(sid string) string { return k.base + "s:" + sid }

// line and tix are the line of processes waiting for the counter bid (or
// for the global window, globalLine) and their tickets.
func (k credKeys) line(bid string) string { return k.base + "w:" + bid }
func (k credKeys) tix(bid string) string  { return k.base + "t:" + bid }

// globalLine names the global window's line.
const globalLine = "g"

func (k credKeys) bucket(bid string) string { return k.base + "b:" + bid }

// learnedID names the counter of bucket hash on major.
func learnedID(hash, major string) string { return "h" + digest(hash, major) }

// probeID names the probe counter of route on major.
func probeID(route, major string) string { return "r" + digest(route, major) }

// noneID names the credential's counter for routes without a bucket.
const noneID = "n"

// guessedID returns the id of the counter a claim on route and major
// counts against when the route's hash is guess: the learned bucket, the
// counter of routes without one (noBucket), or the route's probe counter
// ("" unknown).
func guessedID(guess, route, major string) string {
	switch guess {
	case "":
		return probeID(route, major)
	case noBucket:
		return noneID
	default:
		return learnedID(guess, major)
	}
}

// bucketID returns the id of the counter a permit of kind was granted from.
func bucketID(kind int, hash, route, major string) string {
	switch kind {
	case kindLearned:
		return learnedID(hash, major)
	case kindNone:
		return noneID
	default:
		return probeID(route, major)
	}
}
