package memstore

import (
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/model"
)

// invalidLog counts invalid responses in slots of model.InvalidSlot, a
// sliding window that errs on the side of counting too much (up to one slot
// longer than store.InvalidWindow). The sum is cached per slot, so counting
// is constant time. Times are the store's milliseconds.
type invalidLog struct {
	slots [model.InvalidSlots + 1]struct {
		n   int
		idx int64
	}
	sumIdx int64 // slot index the cached sum is for; -1 when stale
	sum    int
	oldest int64
}

func (l *invalidLog) add(now int64) {
	i := now / model.InvalidSlot
	s := &l.slots[i%int64(len(l.slots))]
	if s.idx != i || s.n == 0 {
		s.idx, s.n = i, 0
	}
	s.n++
	l.sumIdx = -1
}

// count returns the number of invalid responses in the window and when the
// oldest of them stops counting.
func (l *invalidLog) count(now int64) (int, int64) {
	cur := now / model.InvalidSlot
	if cur != l.sumIdx {
		l.sum, l.oldest = 0, cur+1
		for _, s := range l.slots {
			if s.n > 0 && model.InvalidCounts(cur, s.idx) {
				l.sum += s.n
				l.oldest = min(l.oldest, s.idx)
			}
		}
		l.sumIdx = cur
	}
	return l.sum, model.InvalidFree(l.oldest)
}

// maxDead bounds the webhook and interaction tokens on cooldown kept per
// credential.
const maxDead = 4096

// refuse applies the invalid-request guard and the 401/404 cooldowns.
func (s *Store) refuse(cr *cred, c *store.Claim, now int64) error {
	if budget := s.pol.InvalidBudget; budget > 0 {
		if n, free := s.invalid.count(now); n >= budget {
			return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: ms(free - now), Err: store.ErrInvalidBudget}
		}
	}
	if c.TokenAuth {
		if until, ok := cr.dead[c.Major]; ok && now < until {
			return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: ms(until - now), Err: store.ErrWebhookGone}
		}
		return nil
	}
	if now < cr.m.Unauthorized {
		return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: ms(cr.m.Unauthorized - now), Err: store.ErrUnauthorized}
	}
	return nil
}

// count feeds the invalid-request guard and the 401/404 cooldowns.
func (s *Store) count(cr *cred, c *store.Claim, u *store.Update, now int64) {
	if model.Invalid(int64(u.Status), string(u.Scope)) {
		s.invalid.add(now)
	}
	if s.pol.Cooldown < 0 {
		return
	}
	until := now + millis(s.pol.Cooldown)
	switch model.CooldownOf(int64(u.Status), c.TokenAuth, c.Credential == store.Unauthenticated) {
	case model.CooldownMajor:
		if cr.dead == nil {
			cr.dead = make(map[string]int64)
		}
		if _, ok := cr.dead[c.Major]; !ok && len(cr.dead) >= maxDead {
			// Bounded whatever callers send: forget expired cooldowns,
			// else any one. A forgotten webhook is asked again, and a
			// 404 is not an invalid request.
			for m, u := range cr.dead {
				if u <= now || len(cr.dead) >= maxDead {
					delete(cr.dead, m)
				}
			}
		}
		cr.dead[c.Major] = until
	case model.CooldownCredential:
		cr.m.Unauthorized = until
	}
}
