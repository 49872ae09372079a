package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratecord/ratecord/internal/rediscount"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/redisstore"
)

// bucketEmulator plays one Discord bucket with fixed windows and counts the
// requests that arrive beyond its limit.
type bucketEmulator struct {
	mu     sync.Mutex // guards every field below
	limit  int
	window time.Duration
	end    time.Time
	used   int
	over   int
}

func (e *bucketEmulator) serve(c store.Claim) store.Update {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	if !now.Before(e.end) {
		e.end, e.used = now.Add(e.window), 0
	}
	e.used++
	if e.used > e.limit {
		e.over++
	}
	after := (e.end.Sub(now) + time.Millisecond - 1).Truncate(time.Millisecond)
	return limitsOf(c, e.limit, max(0, e.limit-e.used), after)
}

// TestCommandsPerGrant runs 4 stores ("processes", each with its own client)
// x 50 goroutines on one bucket and measures the Redis commands sent per
// granted request. It also checks that no request exceeds the bucket and
// that every process is served.
func TestCommandsPerGrant(t *testing.T) {
	const (
		processes = 4
		workers   = 50
		each      = 3
	)
	addr := redisAddr(t)
	prefix := testPrefix(t)
	e := &bucketEmulator{limit: 20, window: 100 * time.Millisecond}
	c := store.Claim{Credential: "cred", Route: "POST /channels/:id/messages", Major: "channels/1"}

	var hooks []*rediscount.Hook
	var stores []*redisstore.Store
	for range processes {
		client := newClient(t, addr)
		h := &rediscount.Hook{}
		client.AddHook(h)
		hooks = append(hooks, h)
		s := redisstore.New(client, redisstore.WithPrefix(prefix), redisstore.WithPolicy(store.Policy{ResetOffset: 2 * time.Millisecond}))
		t.Cleanup(func() { s.Close() })
		stores = append(stores, s)
	}
	// Learn the bucket first, outside the measurement.
	if err := acquire(t, stores[0], c, time.Second).Report(t.Context(), e.serve(c)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(e.window)
	before, setupBefore := int64(0), int64(0)
	for _, h := range hooks {
		before += h.Commands.Load()
		setupBefore += h.Setup.Load()
	}

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var grants [processes]atomic.Int64
	errs := make(chan error, processes*workers)
	start := time.Now()
	for i, s := range stores {
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					p, err := s.Acquire(ctx, c)
					if err != nil {
						errs <- fmt.Errorf("process %d worker %d: Acquire = %w", i, w, err)
						return
					}
					grants[i].Add(1)
					if err := p.Report(ctx, e.serve(c)); err != nil {
						errs <- fmt.Errorf("process %d worker %d: Update = %w", i, w, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	after, setupAfter := int64(0), int64(0)
	for _, h := range hooks {
		after += h.Commands.Load()
		setupAfter += h.Setup.Load()
	}
	total := int64(0)
	for i := range grants {
		total += grants[i].Load()
		if grants[i].Load() != workers*each {
			t.Errorf("process %d was granted %d requests; want %d", i, grants[i].Load(), workers*each)
		}
	}
	per := float64(after-before) / float64(total)
	t.Logf("%d processes x %d goroutines, bucket %d per %v: %d grants in %v, %d Redis commands, %.2f commands per granted request (plus %d connection handshake commands)",
		processes, workers, e.limit, e.window, total, elapsed.Round(time.Millisecond), after-before, per, setupAfter-setupBefore)
	if e.over > 0 {
		t.Errorf("%d requests arrived beyond the bucket's limit", e.over)
	}
	if per > 2 {
		t.Errorf("%.2f Redis commands per granted request; want at most 2", per)
	}
}
