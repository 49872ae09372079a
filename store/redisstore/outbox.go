package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
)

// update is one Update of a permit granted through Redis, waiting in the
// outbox to be written.
type update struct {
	seq uint64
	h   *permit
	u   store.Update

	// Set by apply when the update joins a pipeline; the updates of one
	// step call share its cmd.
	cmd *redis.Cmd
	bid string // the bucket id whose queues the reply may wake
}

// outbox is the ordered queue of updates that Update hands to the writer,
// so that no response waits for Redis. It is bounded: when full, the
// oldest update is dropped and counted.
type outbox struct {
	mu       sync.Mutex        // guards every field below
	items    []*update         // not yet written, oldest first
	next     uint64            // seq of the next update
	written  uint64            // every update with a smaller seq was written or dropped
	last     map[string]uint64 // credential -> seq of its newest update not yet written
	failures uint64            // write rounds that failed or stalled
	failing  bool              // the last round failed or stalled, and none succeeded since
	change   chan struct{}     // closed and replaced when written or failures change
	dropped  uint64
	running  bool // the writer goroutine was started
	busy     bool // a write is under way: the writer's, or a claim's that took the updates

	kick   chan struct{} // capacity 1: an update joined
	urgent chan struct{} // capacity 1: an update other processes must see at once joined
	retry  chan struct{} // capacity 1: Redis answers again, retry now
}

func newOutbox() outbox {
	return outbox{
		last:   make(map[string]uint64),
		change: make(chan struct{}),
		kick:   make(chan struct{}, 1),
		urgent: make(chan struct{}, 1),
		retry:  make(chan struct{}, 1),
	}
}

// broadcast wakes everyone waiting for progress; o.mu must be held.
func (o *outbox) broadcast() {
	close(o.change)
	o.change = make(chan struct{})
}

// forget removes the head updates with a seq below o.written; o.mu must be
// held.
func (o *outbox) forget() {
	n := 0
	for n < len(o.items) && o.items[n].seq < o.written {
		it := o.items[n]
		if o.last[it.h.cred] == it.seq {
			delete(o.last, it.h.cred)
		}
		o.items[n] = nil
		n++
	}
	o.items = o.items[n:]
	if len(o.items) == 0 {
		o.items = nil // let a long backlog's array go
	}
}

// failed records a round that failed or stalled; o.mu must be held.
func (o *outbox) failed() {
	o.failures++
	o.failing = true
	o.broadcast()
}

func poke(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// enqueue hands the update of a permit granted through Redis to the
// writer, which it starts on first use. It never blocks on Redis.
func (s *Store) enqueue(h *permit, u store.Update) error {
	o := &s.out
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return store.ErrClosed
	}
	o.mu.Lock()
	if !o.running {
		o.running = true
		s.wg.Add(1)
		go s.write()
	}
	dropped := 0
	for len(o.items) >= s.outboxLimit {
		o.written = o.items[0].seq + 1
		o.forget()
		o.dropped++
		dropped++
	}
	o.items = append(o.items, &update{seq: o.next, h: h, u: u})
	o.last[h.cred] = o.next
	o.next++
	if dropped > 0 {
		o.broadcast()
	}
	o.mu.Unlock()
	poke(o.kick)
	if u.Status == 429 || u.HasLimit && (u.Remaining == 0 || int64(u.Limit) < h.limit) {
		// A pause, a bucket spent, a limit lowered: other processes must
		// not wait for a claim of this one to learn it.
		poke(o.urgent)
	}
	if dropped > 0 {
		s.log.LogAttrs(context.Background(), slogWarn, "ratecord: update outbox full, oldest update dropped",
			slog.Int("limit", s.outboxLimit))
	}
	return nil
}

// errOutbox reports that updates a claim must see could not be written.
var errOutbox = errors.New("redisstore: earlier updates not written")

// synced waits until every update of credential cred handed to the
// outbox so far is written, so that a claim made next sees them; waited
// reports whether it had to wait. ok is false when a write round fails or
// stalls first, when the outbox is already failing under [FailClosed], or
// when the Store closes.
func (s *Store) synced(cred string) (waited, ok bool) {
	o := &s.out
	o.mu.Lock()
	target, pending := o.last[cred]
	if !pending || target < o.written {
		o.mu.Unlock()
		return false, true
	}
	if o.failing && s.policy == FailClosed {
		o.mu.Unlock()
		return false, false
	}
	f0 := o.failures
	for {
		ch := o.change
		o.mu.Unlock()
		select {
		case <-ch:
		case <-s.done:
			return true, false
		}
		o.mu.Lock()
		if target < o.written {
			o.mu.Unlock()
			return true, true
		}
		if o.failures != f0 {
			o.mu.Unlock()
			return true, false
		}
	}
}

// write is the writer goroutine: it writes the outbox to Redis in order,
// several updates per round trip, until the Store closes. Updates it could
// not write stay queued and are tried again, every poll interval at first,
// then backing off up to the probe interval, and at once when the prober
// sees Redis answer again.
func (s *Store) write() {
	defer s.wg.Done()
	o := &s.out
	var backoff time.Duration
	for {
		if backoff > 0 {
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-o.retry:
			case <-s.done:
				t.Stop()
				return
			}
			t.Stop()
		}
		o.mu.Lock()
		for o.busy {
			ch := o.change
			o.mu.Unlock()
			select {
			case <-ch:
			case <-s.done:
				return
			}
			o.mu.Lock()
		}
		batch := append([]*update(nil), o.items[:min(len(o.items), s.maxBatch)]...)
		o.busy = len(batch) > 0
		o.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-o.kick:
			case <-s.done:
				return
			}
			// Give the claim the process is likely to make next the
			// chance to carry the update: one round trip for both.
			t := time.NewTimer(flushDelay)
			select {
			case <-t.C:
			case <-o.urgent:
				t.Stop()
			case <-s.done:
				t.Stop()
				return
			}
			continue
		}
		err := s.writeBatch(s.ctx, batch, false)
		o.mu.Lock()
		o.busy = false
		o.broadcast()
		o.mu.Unlock()
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			backoff = min(max(2*backoff, s.poll), s.probeEvery)
			continue
		}
		backoff = 0
	}
}

// flushDelay is how long an update waits for a claim to carry it before
// the writer sends it alone.
const flushDelay = 2 * time.Millisecond

// take hands a claim of credential cred the queued updates, so that they
// travel with it in one round trip, when every queued update is cred's
// (the outbox is written in order), there are at most max of them, and no
// write is under way. The claim must then call taken with the outcome.
func (o *outbox) take(cred string, max int) []*update {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.busy || len(o.items) == 0 || len(o.items) > max {
		return nil
	}
	for _, it := range o.items {
		if it.h.cred != cred {
			return nil
		}
	}
	o.busy = true
	return append([]*update(nil), o.items...)
}

// taken ends the write of updates a claim took: when ok, Redis applied
// them (wakes holds their replies) and they leave the outbox; otherwise
// they stay, for the writer to send again.
func (s *Store) taken(ups []*update, wakes []int64, ok bool) {
	if ok {
		for _, it := range ups {
			if it.u.Sent {
				s.learn(it.h, it.u)
			}
		}
	}
	o := &s.out
	o.mu.Lock()
	if ok {
		if last := ups[len(ups)-1].seq; last >= o.written {
			o.written = last + 1
			o.forget()
		}
		o.failing = false
	}
	o.busy = false
	o.broadcast()
	o.mu.Unlock()
	if ok {
		for i, it := range ups {
			s.wake(it.h.cred, it.bid, wakes[i])
		}
	}
	poke(o.kick)
}

// writeBatch writes batch in one pipeline of update script calls and
// applies the process-local effects of those written. It returns an error
// when Redis failed or stalled before every update was written; the rest
// stay queued. The calls are EVALSHA, or EVAL when eval is true.
func (s *Store) writeBatch(parent context.Context, batch []*update, eval bool) error {
	// Consecutive updates of one credential go in one step call (its keys
	// share a hash tag); the calls go in one pipeline.
	var groups [][]*update
	for i, it := range batch {
		if i > 0 && it.h.cred == batch[i-1].h.cred {
			groups[len(groups)-1] = append(groups[len(groups)-1], it)
			continue
		}
		groups = append(groups, []*update{it})
	}
	stalled, _ := s.bounded(parent, func(ctx context.Context) error {
		_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, g := range groups {
				s.apply(ctx, p, g, eval)
			}
			return nil
		})
		return err
	}, func() {
		s.out.mu.Lock()
		s.out.failed()
		s.out.mu.Unlock()
		s.failed(errStalled)
	})

	done := 0
	type result struct {
		wake int64
		ok   bool // applied as sent: its route may be learned
	}
	results := make([]result, 0, len(batch))
	var err error
	noScript := false
	for _, g := range groups {
		v, cerr := g[0].cmd.Result()
		if cerr == nil {
			r, perr := parseStep(v, len(g), false)
			if perr != nil {
				// A reply nobody understands: drop the updates rather than
				// write them forever.
				s.failed(perr)
			}
			for i := range g {
				wake := int64(-1)
				if perr == nil {
					wake = r.wakes[i]
				}
				results = append(results, result{wake: wake, ok: perr == nil})
			}
			done += len(g)
			continue
		}
		if isNoScript(cerr) && !eval {
			// The server restarted or flushed its scripts: EVALSHA cannot
			// fall back to EVAL inside a pipeline, so the rest is written
			// again with EVAL, which also caches the script again.
			noScript = true
			break
		}
		if permanent(cerr) {
			s.errs.Add(1)
			s.log.LogAttrs(context.Background(), slog.LevelError, "ratecord: update rejected by redis, dropped", attrErr(cerr))
			for range g {
				results = append(results, result{wake: -1})
			}
			done += len(g)
			continue
		}
		if !stalled {
			s.failed(cerr)
		}
		err = cerr
		break
	}

	for i, it := range batch[:done] {
		if results[i].ok && it.u.Sent {
			s.learn(it.h, it.u)
		}
	}
	o := &s.out
	o.mu.Lock()
	if done > 0 && batch[done-1].seq >= o.written {
		o.written = batch[done-1].seq + 1
		o.forget()
	}
	if err != nil {
		if !stalled {
			o.failed()
		}
	} else {
		o.failing = false
	}
	if done > 0 || err == nil {
		o.broadcast()
	}
	o.mu.Unlock()
	for i, it := range batch[:done] {
		s.wake(it.h.cred, it.bid, results[i].wake)
	}
	if noScript {
		return s.writeBatch(parent, batch[done:], true)
	}
	return err
}

// isNoScript reports whether err is Redis's answer to EVALSHA for a
// script it does not have.
func isNoScript(err error) bool {
	return redis.HasErrorPrefix(err, "NOSCRIPT")
}

// permanent reports whether err is an error reply that sending the same
// command again would not change; connection errors, timeouts and the
// replies of a server that is loading, busy or failing over are not.
func permanent(err error) bool {
	var rerr redis.Error
	if !errors.As(err, &rerr) || errors.Is(err, redis.Nil) {
		return false
	}
	for _, p := range []string{"NOSCRIPT", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "MOVED", "ASK"} {
		if strings.HasPrefix(rerr.Error(), p) {
			return false
		}
	}
	return true
}

// flush writes what it can of the outbox before ctx ends, then drops the
// rest with a logged count. Close calls it once no other goroutine of the
// Store runs.
func (s *Store) flush(ctx context.Context) {
	o := &s.out
	for ctx.Err() == nil {
		o.mu.Lock()
		batch := append([]*update(nil), o.items[:min(len(o.items), s.maxBatch)]...)
		o.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		if err := s.writeBatch(ctx, batch, false); err != nil {
			break
		}
	}
	o.mu.Lock()
	n := len(o.items)
	if n > 0 {
		o.written = o.next
		o.forget()
		o.dropped += uint64(n)
		o.broadcast()
	}
	o.mu.Unlock()
	if n > 0 {
		s.log.LogAttrs(context.Background(), slogWarn, "ratecord: closing with updates redis did not take, dropped",
			slog.Int("updates", n))
	}
}
