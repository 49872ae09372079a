package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ratecord/ratecord/store"
)

// invalidGuard counts the invalid responses (401, 403, and 429 other than
// scope shared) of every process of a group, as Discord counts them for an
// IP address, and refuses requests once a claim's budget is spent.
//
// The count lives on a key of its own (its own hash tag: it spans
// credentials, so no claim can read it atomically). A process writes its
// invalid responses there as they come, at most once a second, and learns
// the group's count without asking: it reads it when its subscription to
// the group's channel starts, and the process whose write makes the count
// cross an eighth of the budget publishes the count there. Between those,
// a process adds what it counted itself, so it refuses at once on its own
// responses and, on those of the others, as soon as the note arrives.
// While the count is past half the budget, a process that sends requests
// reads it every second as well, to learn when old responses stop
// counting.
type invalidGuard struct {
	mu      sync.Mutex // guards every field below
	known   int        // the group's count at the last read or note
	freeAt  time.Time  // when the oldest counted response stops counting
	pending int        // counted here, not written yet
	readAt  time.Time  // the last read or note
	active  time.Time  // the last claim checked
	running bool       // the writer goroutine runs
	kick    chan struct{}
}

// invalidRead is how often the group's count is read while it is past
// half the budget and requests flow.
const invalidRead = time.Second

// refuseInvalid returns the guard's refusal of c, or nil.
func (s *Store) refuseInvalid(c *store.Claim) error {
	budget := s.pol.InvalidBudget
	if budget < 0 {
		return nil
	}
	g := &s.invalid
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active = now
	if 2*g.known >= budget && now.Sub(g.readAt) >= invalidRead {
		s.startGuard()
	}
	if g.known+g.pending < budget {
		return nil
	}
	retry := store.InvalidWindow
	if g.pending == 0 && g.freeAt.After(now) {
		retry = g.freeAt.Sub(now)
	}
	return &store.WaitError{Scope: store.ScopeGuard, RetryAfter: retry, Err: store.ErrInvalidBudget}
}

// countInvalid records an invalid response of this process.
func (s *Store) countInvalid() {
	if s.pol.InvalidBudget < 0 {
		return
	}
	g := &s.invalid
	g.mu.Lock()
	g.pending++
	s.startGuard()
	g.mu.Unlock()
}

// invalidNote applies the group's count a process published (this one
// included). The count only falls when its oldest response stops counting:
// a lower count before then is a note that came late, after a newer count
// was read, and is dropped.
func (s *Store) invalidNote(n int, free time.Duration) {
	g := &s.invalid
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	if n < g.known && now.Before(g.freeAt) {
		return
	}
	g.known, g.freeAt, g.readAt = n, now.Add(free), now
}

// readInvalid has the writer read the group's count, as when the
// subscription to the group's channel starts: notes sent before were
// missed.
func (s *Store) readInvalid() {
	if s.pol.InvalidBudget < 0 {
		return
	}
	g := &s.invalid
	g.mu.Lock()
	g.readAt = time.Time{}
	s.startGuard()
	g.mu.Unlock()
}

// startGuard kicks the guard's writer, starting it if needed; g.mu must be
// held.
func (s *Store) startGuard() {
	g := &s.invalid
	if !g.running {
		s.mu.Lock()
		closed := s.closed
		if !closed {
			s.wg.Add(1)
		}
		s.mu.Unlock()
		if closed {
			return
		}
		g.running = true
		go s.guardLoop()
	}
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

// guardLoop writes this process's invalid responses and reads the group's
// count when it must, and ends when neither is needed.
func (s *Store) guardLoop() {
	defer s.wg.Done()
	g := &s.invalid
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-g.kick:
		case <-t.C:
		}
		g.mu.Lock()
		add := g.pending
		budget := s.pol.InvalidBudget
		high := 2*g.known >= budget && time.Since(g.active) <= 2*invalidRead
		if add == 0 && !g.readAt.IsZero() && !(high && time.Since(g.readAt) >= invalidRead) {
			if !high {
				g.running = false
				g.mu.Unlock()
				return
			}
			g.mu.Unlock()
			t.Reset(invalidRead)
			continue
		}
		before := g.known
		g.mu.Unlock()
		n, free, err := s.syncInvalid(add)
		g.mu.Lock()
		if err == nil {
			g.pending -= add
			g.known, g.freeAt, g.readAt = n, time.Now().Add(free), time.Now()
		}
		g.mu.Unlock()
		if err != nil {
			if s.ctx.Err() == nil {
				s.errs.Add(1)
			}
		} else if add > 0 && budget > 0 && crossed(before, n, budget) {
			// Tell the group: its processes do not read the count.
			note := "i\n" + strconv.Itoa(n) + "\n" + strconv.FormatInt(millis(free), 10)
			ctx, cancel := context.WithTimeout(s.ctx, s.callTimeout)
			_ = s.client.Publish(ctx, s.edgeChannel(), note).Err()
			cancel()
		}
		t.Reset(invalidRead)
	}
}

// crossed reports whether a count that went from a to b crossed a
// multiple of an eighth of budget, or the budget.
func crossed(a, b, budget int) bool {
	step := max(budget/8, 1)
	return b >= budget && a < budget || b/step != a/step
}

// syncInvalid adds add invalid responses to the group's count and returns
// the count and how long until its oldest response stops counting.
func (s *Store) syncInvalid(add int) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.callTimeout)
	defer cancel()
	v, err := s.fcall(ctx, fnInvalid, []string{s.invalidKey()}, add, s.clockArg()).Result()
	if err != nil {
		return 0, 0, err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return 0, 0, fmt.Errorf("%w: invalid: %T %v", errReply, v, v)
	}
	n, err1 := replyInt(a, 0)
	free, err2 := replyInt(a, 1)
	if err := errors.Join(err1, err2); err != nil || n < 0 || free < 0 {
		return 0, 0, fmt.Errorf("%w: invalid: %v", errReply, a)
	}
	return int(n), time.Duration(free) * time.Millisecond, nil
}

// invalidKey is the group's count: a hash tag of its own.
func (s *Store) invalidKey() string {
	return s.prefix + ":{" + digest("invalid", s.invalidGroup) + "}:i"
}
