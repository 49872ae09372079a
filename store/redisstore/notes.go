package redisstore

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store/internal/edge"
)

// A Store follows three channels, on one subscription:
//
//   - its own, channelPrefix() + its id, where the scripts push "<tag>
//     <line> <ms>" (and " <hash>" after a probe's response taught the
//     route's bucket) when the turn of this process in a line it waits in (a
//     bucket, the global window, the requests of a kind) has come or moved:
//     a report of another process opened the counter, or the process
//     ahead took its turn and left room, or left the next opening to this
//     one. Only the processes whose turn it is are told, so a push costs
//     Redis one delivery, however many processes share the credential.
//   - its group's, edgeChannel(), where processes publish the Cloudflare
//     blocks they meet, the resources that 429s of scope shared hold, and
//     the group's count of invalid responses when it crosses an eighth of
//     the budget.
//   - the recalls, recallChannel(), where the scripts publish "<tag>
//     <line>" when a response spent a bucket that had grants out (see
//     recall.go): rare, since a bucket whose headers tell the truth is
//     never granted more than it holds.
//
// Pub/sub over keyspace notifications or client tracking, which would tell
// every process of every change of a key it watches, and over blocking
// pops, which would hold a connection per waiting queue: a push reaches
// the one process it concerns, and a subscription costs one connection per
// process. Pub/sub delivers at most once: a subscription that was down
// (a reconnection) has every queue ask again, and every wait has a
// deadline of its own ([WithPushWait]), so a lost push costs time, never a
// wrong grant.

// subscribeWait bounds how long a Store's first calls wait for its
// subscription to be confirmed (see awaitSubscription).
const subscribeWait = 100 * time.Millisecond

// awaitSubscription waits, before a Store's first calls, until the
// subscription to its own channel is confirmed, or subscribeWait passes,
// or the Store closes: a call sent before may miss the push its reply
// says to wait for, and once confirmed, the queues whose calls went
// before ask again (resyncBefore), a second call each. Only the first
// calls wait, about one Redis round trip: once a wait has ended, none
// does, confirmed or not (a subscription that does not come only delays
// pushes, and the waits that need them have deadlines of their own).
func (s *Store) awaitSubscription() {
	if s.subWaited.Load() {
		return
	}
	t := time.NewTimer(subscribeWait)
	defer t.Stop()
	select {
	case <-s.subscribed:
	case <-t.C:
	case <-s.done:
	}
	s.subWaited.Store(true)
}

// procChannel is the channel the scripts push to for this Store.
func (s *Store) procChannel() string { return s.channelPrefix() + s.id }

// watch starts following the Store's channels, once. A Ring's scripts run
// on the shard of their credential and publish there: the Store follows
// its own channel on every shard, and the group's on the shard its name
// picks, where the processes publish it.
func (s *Store) watch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.watching.Load() {
		return
	}
	s.watching.Store(true)
	if ring, ok := s.client.(*redis.Ring); ok {
		_ = ring.ForEachShard(s.ctx, func(ctx context.Context, c *redis.Client) error {
			s.wg.Add(1)
			go s.follow(func(ctx context.Context) *redis.PubSub { return c.Subscribe(ctx, s.procChannel(), s.recallChannel()) })
			return nil
		})
		s.wg.Add(1)
		go s.follow(func(ctx context.Context) *redis.PubSub { return s.client.Subscribe(ctx, s.edgeChannel()) })
		return
	}
	s.wg.Add(1)
	go s.follow(func(ctx context.Context) *redis.PubSub {
		return s.client.Subscribe(ctx, s.edgeChannel(), s.procChannel(), s.recallChannel())
	})
}

// follow receives the messages of one subscription until the Store
// closes.
func (s *Store) follow(subscribe func(context.Context) *redis.PubSub) {
	defer s.wg.Done()
	ps := subscribe(s.ctx)
	// A read of the subscription does not end with its context: closing
	// the subscription ends it.
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-s.done:
		case <-stop:
		}
		_ = ps.Close()
	}()
	for {
		msg, err := ps.Receive(s.ctx)
		if s.ctx.Err() != nil {
			return
		}
		switch m := msg.(type) {
		case *redis.Message:
			s.note(m.Channel, m.Payload)
			continue
		case *redis.Subscription:
			// Subscribed, for the first time or again: what was published
			// meanwhile is lost.
			switch m.Channel {
			case s.edgeChannel():
				_ = s.readGates(s.ctx)
				s.readInvalid()
			case s.procChannel():
				// A call sent from now on runs after the subscription:
				// only the queues whose last call went before may have
				// missed a push.
				s.resyncBefore(time.Now())
				s.subOnce.Do(func() { close(s.subscribed) })
			}
			continue
		}
		if err != nil {
			// The subscription reconnects on the next Receive; do not spin.
			t := time.NewTimer(s.probeEvery)
			select {
			case <-s.done:
				t.Stop()
				return
			case <-t.C:
			}
		}
	}
}

// note applies a message of one of the Store's channels.
func (s *Store) note(channel, payload string) {
	if channel == s.recallChannel() {
		s.recallNote(payload)
		return
	}
	if channel != s.edgeChannel() {
		if tag, name, at, hash, ok := parsePush(payload); ok {
			s.pushed(tag, name, at, hash)
		}
		return
	}
	if st, ok := parseBlockNote(payload); ok {
		// The hash may not hold the block yet: a note follows once it
		// does.
		s.gates.Merge([]edge.State{st}, time.Now())
		return
	}
	if res, pause, from, ok := parseSharedNote(payload); ok {
		if from != s.id {
			s.gates.HoldResource(res, pause)
		}
		return
	}
	if n, free, ok := parseInvalidNote(payload); ok {
		s.invalidNote(n, free)
		return
	}
	_ = s.readGates(s.ctx)
}

// parseInvalidNote reads the note a process publishes when the group's
// count of invalid responses crosses an eighth of the budget: "i", the
// count and the milliseconds until its oldest response stops counting,
// one per line.
func parseInvalidNote(p string) (int, time.Duration, bool) {
	parts := strings.Split(p, "\n")
	if len(parts) != 3 || parts[0] != "i" {
		return 0, 0, false
	}
	n, err1 := strconv.Atoi(parts[1])
	ms, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || n < 0 || ms < 0 || ms > 86_400_000 {
		return 0, 0, false
	}
	return n, time.Duration(ms) * time.Millisecond, true
}

// parsePush reads a push: the credential's tag, the line's name, in how
// many milliseconds the receiver's turn comes and, after a probe's
// response, the bucket hash its route maps to, separated by spaces.
func parsePush(p string) (tag, name string, at time.Duration, hash string, ok bool) {
	f := strings.Split(p, " ")
	if len(f) != 3 && len(f) != 4 || f[0] == "" || f[1] == "" {
		return "", "", 0, "", false
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil || n < 0 || n > 86_400_000 {
		return "", "", 0, "", false
	}
	if len(f) == 4 {
		if hash = f[3]; hash == "" {
			return "", "", 0, "", false
		}
	}
	return f[0], f[1], time.Duration(n) * time.Millisecond, hash, true
}
