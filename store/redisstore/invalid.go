package redisstore

import (
	"context"
	"errors"
	"fmt"
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
// invalid responses there as they come and reads the group's count at most
// once a second while it sends requests; between reads it adds what it
// counted itself, so it refuses at once on its own responses and within
// about a second on those of other processes.
type invalidGuard struct {
	mu      sync.Mutex // guards every field below
	known   int        // the group's count at the last read
	freeAt  time.Time  // when the oldest counted response stops counting
	pending int        // counted here, not written yet
	readAt  time.Time  // the last read
	active  time.Time  // the last claim checked
	running bool       // the writer goroutine runs
	kick    chan struct{}
}

// invalidRead is how often the group's count is read while requests flow.
const invalidRead = time.Second

// refuse returns the guard's refusal of c, or nil.
func (s *Store) refuseInvalid(c *store.Claim) error {
	budget := s.pol.InvalidBudget
	g := &s.invalid
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active = now
	if now.Sub(g.readAt) >= invalidRead {
		s.startGuard()
	}
	if budget < 0 || g.known+g.pending < budget {
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
	g := &s.invalid
	g.mu.Lock()
	g.pending++
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
// count, while the process sends requests or has counts to write.
func (s *Store) guardLoop() {
	defer s.wg.Done()
	g := &s.invalid
	t := time.NewTimer(invalidRead)
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
		idle := add == 0 && time.Since(g.active) > 2*invalidRead
		if idle {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		n, free, err := s.syncInvalid(add)
		g.mu.Lock()
		if err == nil {
			g.pending -= add
			g.known, g.freeAt, g.readAt = n, time.Now().Add(free), time.Now()
		}
		g.mu.Unlock()
		if err != nil && s.ctx.Err() == nil {
			s.errs.Add(1)
		}
		t.Reset(invalidRead)
	}
}

// syncInvalid adds add invalid responses to the group's count and returns
// the count and how long until its oldest response stops counting.
func (s *Store) syncInvalid(add int) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(s.ctx, s.callTimeout)
	defer cancel()
	v, err := invalidScript.Run(ctx, s.client, []string{s.invalidKey()}, add, s.clockArg()).Result()
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
