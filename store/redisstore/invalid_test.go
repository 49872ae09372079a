package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// TestInvalidCountedPerGroup checks that invalid responses count for every
// credential and every process of a group, as Discord counts them for an
// IP address, and not for another group.
func TestInvalidCountedPerGroup(t *testing.T) {
	client := newClient(t, redisAddr(t))
	prefix := testPrefix(t)
	newStore := func(opts ...redisstore.Option) *redisstore.Store {
		s := redisstore.New(client, append([]redisstore.Option{redisstore.WithPrefix(prefix), redisstore.WithPolicy(store.Policy{InvalidBudget: 3})}, opts...)...)
		t.Cleanup(func() { s.Close() })
		return s
	}
	a, b, other := newStore(), newStore(), newStore(redisstore.WithInvalidGroup("other host"))
	ctx := t.Context()
	claim := func(cred string, major string) store.Claim {
		return store.Claim{Credential: cred, Route: "GET /channels/:id", Major: major}
	}
	acquire := func(s *redisstore.Store, c store.Claim) (*store.Reservation, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		return s.Acquire(ctx, c)
	}
	// Three 403s of three credentials through process a.
	for i, cred := range []string{"bot1", "bot2", "bot3"} {
		c := claim(cred, "channels/"+string(rune('1'+i)))
		p, err := acquire(a, c)
		if err != nil {
			t.Fatalf("Acquire before the budget is spent = %v", err)
		}
		u := store.Update{Sent: true, Status: 403}
		if err := p.Report(ctx, u); err != nil {
			t.Fatalf("Update = %v", err)
		}
	}
	// Process a refuses at once, for a fourth credential too.
	if _, err := acquire(a, claim("bot4", "channels/9")); !errors.Is(err, store.ErrInvalidBudget) {
		t.Fatalf("Acquire in the process that counted 3 invalid responses = %v; want ErrInvalidBudget", err)
	}
	// Process b learns it within its next read of the group's count.
	deadline := time.Now().Add(5 * time.Second)
	for {
		p, err := acquire(b, claim("bot5", "channels/10"))
		if errors.Is(err, store.ErrInvalidBudget) {
			var we *store.WaitError
			if !errors.As(err, &we) || we.Scope != store.ScopeGuard || we.RetryAfter <= 0 || we.RetryAfter > store.InvalidWindow+10*time.Second {
				t.Errorf("refusal = %#v; want scope guard and a retry within the invalid window and one 10 s slot", err)
			}
			break
		}
		if err != nil {
			t.Fatalf("Acquire in another process = %v; want a permit or ErrInvalidBudget", err)
		}
		p.Cancel()
		if time.Now().After(deadline) {
			t.Fatal("another process of the group still grants 5 s after the group's budget was spent")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Another group counts on its own.
	for range 3 {
		p, err := acquire(other, claim("bot1", "channels/1"))
		if err != nil {
			t.Fatalf("Acquire in another group = %v; want a permit", err)
		}
		p.Cancel()
		time.Sleep(400 * time.Millisecond) // let its reads of its own group's count happen
	}
}
