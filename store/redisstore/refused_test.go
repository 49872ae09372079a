package redisstore

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
)

// countHook counts the calls of the step function a client sends.
type countHook struct{ fcalls atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); strings.EqualFold(cmd.Name(), "fcall") && len(a) > 1 {
			if name, _ := a[1].(string); strings.HasSuffix(name, "_step") {
				h.fcalls.Add(1)
			}
		}
		return next(ctx, cmd)
	}
}
func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRefusedCallsBackOff: calls that Redis answers with an error (here a
// key of the credential holding the wrong type) are not sent again in a
// tight loop: the driver waits longer after each, and after three in a
// row the failure policy applies, so the waiter is granted by the local
// limiter rather than wait forever.
func TestRefusedCallsBackOff(t *testing.T) {
	c := stepClient(t)
	hook := &countHook{}
	c.AddHook(hook)
	s := New(c, WithPrefix("ratecordtest:refused:"+time.Now().Format(time.RFC3339Nano)), WithProbeInterval(time.Hour))
	t.Cleanup(func() { s.Close() })
	claim := store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1", Global: true}
	k := s.keysOf(claim.Credential)
	if err := c.Set(t.Context(), k.cred(), "not a hash", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	p, err := s.Acquire(ctx, claim)
	if err != nil {
		t.Fatalf("Acquire with every call refused = %v; want a grant of the local limiter", err)
	}
	p.Cancel()
	st := s.Stats()
	if !st.Local || st.Fallbacks != 1 {
		t.Fatalf("Stats() = %+v; want local mode after one fallback", st)
	}
	time.Sleep(100 * time.Millisecond) // a tight loop would go on meanwhile
	if n := hook.fcalls.Load(); n < maxRefused || n > maxRefused+2 {
		t.Fatalf("%d calls sent; want %d, then none while the store limits locally", n, maxRefused)
	}
}
