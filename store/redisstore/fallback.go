package redisstore

import (
	"context"
	"log/slog"
	"time"

	"github.com/ratecord/ratecord/store"
)

const (
	slogWarn  = slog.LevelWarn
	slogError = slog.LevelError
)

func attrErr(err error) slog.Attr { return slog.String("error", err.Error()) }
func attrShare(n int) slog.Attr   { return slog.Int("local_share", n) }

// acquireLocal grants c through the local limiter, while the Store limits
// locally; a claim on a bucket too small to share (see smallBucket) waits
// for Redis instead, and claims through it.
func (s *Store) acquireLocal(ctx context.Context, c store.Claim, start time.Time) (grant, error) {
	if s.smallBucket(&c) {
		if werr := s.knownOutage(ctx, &c, start); werr != nil {
			return grant{}, werr
		}
		if err := s.awaitRedis(ctx, &c, start); err != nil {
			return grant{}, err
		}
		return s.claim(ctx, c, start, nil)
	}
	p, err := s.localGrant(ctx, c)
	if err != nil {
		return grant{}, err
	}
	return s.localOnly(ctx, c, start, p)
}

// localOnly returns the local limiter's grant p of c as c's grant while
// the Store limits locally. When Redis came back while c waited for it,
// the other processes, which claim through Redis again, know nothing of
// p: c claims through Redis as well, as in the grace period. (Waiters
// that queued in the local limiter during an outage are granted long after
// Redis is back; on p alone they would add a window's worth to windows
// that Redis fills.)
func (s *Store) localOnly(ctx context.Context, c store.Claim, start time.Time, p *store.Reservation) (grant, error) {
	if !s.degraded.Load() {
		return s.claim(ctx, c, start, p)
	}
	s.localGrants.Add(1)
	return grant{Bucket: p.Bucket, Waited: time.Since(start), Handle: &localPermit{p: p}}, nil
}

// smallBucket reports whether the headers of c's route last named a limit
// smaller than the local share: a bucket of fewer requests per window than
// there are processes. Limiting locally, each process could send at most
// one request per as many windows as make a whole request of its share,
// which bounds what they send together on average, not in each window: two
// of them may meet in one window (a 429 another process's response had
// already foretold). While the Store limits locally, such a bucket waits
// for Redis.
func (s *Store) smallBucket(c *store.Claim) bool {
	if s.share <= 1 {
		return false
	}
	s.mu.Lock()
	f, _ := s.routes.peek(c.Credential + "\x00" + c.Route)
	s.mu.Unlock()
	return f.limit > 0 && int(f.limit) < s.share
}

// knownOutage returns the refusal of c that this process knows from
// Redis's last answers for c's queue (see knownWait), for a claim that
// waits for Redis: a bucket's reset or pause that Discord named lasts
// whatever happens to Redis meanwhile. It costs no Redis command.
func (s *Store) knownOutage(ctx context.Context, c *store.Claim, now time.Time) *store.WaitError {
	s.mu.Lock()
	defer s.mu.Unlock()
	ss := s.sessions[c.Credential]
	if ss == nil {
		return nil
	}
	q := ss.queues[qkey{route: c.Route, major: c.Major, kind: c.Kind}]
	if q == nil {
		return nil
	}
	return s.knownWait(ctx, ss, q, c, now)
}

// awaitRedis waits until the Store limits through Redis again, or fails
// like a wait of unknown length: at once for a NoWait claim, else when
// c's context ends, its MaxWait passes, or it or the Store is closed.
func (s *Store) awaitRedis(ctx context.Context, c *store.Claim, start time.Time) error {
	s.mu.Lock()
	back := s.back
	s.mu.Unlock()
	if back == nil {
		return nil
	}
	if c.NoWait {
		return &store.WaitError{Err: store.ErrWaitTooLong}
	}
	var expired <-chan time.Time
	if c.MaxWait > 0 {
		t := time.NewTimer(max(c.MaxWait-time.Since(start), 0))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-back:
		return nil
	case <-ctx.Done():
		return &store.WaitError{Err: ctx.Err()}
	case <-c.Done:
		return &store.WaitError{Err: store.ErrClosed}
	case <-s.done:
		return &store.WaitError{Err: store.ErrClosed}
	case <-expired:
		return &store.WaitError{Err: store.ErrWaitTooLong}
	}
}

// localGrant returns the local limiter's permit for c, with 1/share of the
// global limit, once the hold-off after the last fallback has passed.
func (s *Store) localGrant(ctx context.Context, c store.Claim) (*store.Reservation, error) {
	if err := s.holdOff(ctx, &c); err != nil {
		return nil, err
	}
	c.GlobalLimit = max(1, s.pol.Limit(&c)/s.share)
	return s.local.Acquire(ctx, c)
}

// localUpdate scales the limits a response reports down to this process's
// share, so that the processes limiting locally stay within the bucket
// together. Remaining and Reset-After describe the bucket as all processes
// use it: a process that refilled its share at that reset could, on a
// sliding window, send again while the others' requests still count. So a
// process takes its share at most once per window: the local bucket is
// spent by each response and refills after the longest window seen on the
// route (window), if that is later than the reset. A bucket of fewer
// requests per window than there are shares (a limit of 1, and 4 shares)
// gives each process one request per as many windows as make a whole
// request of its share: 1 in 4 windows, not 1 in each. That bounds what
// the processes send together on average, not in every window: two of
// them may still meet in one window of such a bucket, which only a shared
// store can prevent.
func (s *Store) localUpdate(u store.Update, window time.Duration) store.Update {
	if u.Scope == store.ScopeBlocked {
		// The Store's own gates hold the block; the local limiter need
		// not hold it twice. (The Store counts it as invalid itself.)
		u.Scope, u.RetryAfter, u.Ban = store.ScopeShared, 0, false
	}
	if u.HasLimit && s.share > 1 {
		per := window
		if u.Limit > 0 && u.Limit < s.share {
			per = min(window*time.Duration(s.share)/time.Duration(u.Limit), maxHold)
		}
		u.Limit = max(1, u.Limit/s.share)
		u.Remaining = 0
		if u.ResetAfter >= 0 {
			u.ResetAfter = max(u.ResetAfter, per-s.pol.ResetOffset)
		}
	}
	return u
}

// probe pings Redis every probe interval while the Store limits locally,
// and switches back to Redis as soon as it answers.
func (s *Store) probe() {
	defer s.wg.Done()
	t := time.NewTimer(s.probeEvery)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		_, err := s.bounded(s.ctx, func(ctx context.Context) error {
			return s.client.Ping(ctx).Err()
		}, func() {})
		if err == nil {
			// Counted before the switch, so that Stats never shows the
			// store back on Redis without the recovery.
			s.recoveries.Add(1)
			s.mu.Lock()
			s.recovered(time.Now())
			s.mu.Unlock()
			s.resync()
			s.log.LogAttrs(context.Background(), slog.LevelInfo, "ratecord: redis available again, limiting through it")
			return
		}
		s.errs.Add(1)
		t.Reset(s.probeEvery)
	}
}
