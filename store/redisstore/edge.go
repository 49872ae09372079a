package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ratecord/ratecord/store/internal/edge"
)

// The Cloudflare blocks of the store live in one hash that every process
// of the store shares (edge.lua). A process that changes it publishes a
// note on the store's channel; every process then reads the hash again, as
// it does when its subscription starts. The fast path reads only the
// process's own copy (edge.Gates): while no block lasts, the blocks cost no
// Redis command.

// edgeRemote is the edge.Remote of a Store.
type edgeRemote struct{ s *Store }

var _ edge.Remote = edgeRemote{}

func (s *Store) edgeKey() string {
	return s.prefix + ":{" + digest("edge", s.invalidGroup) + "}:e"
}

func (s *Store) edgeChannel() string {
	return s.prefix + ":edge:" + digest("edge", s.invalidGroup)
}

func (r edgeRemote) run(ctx context.Context, args ...any) (any, error) {
	args = append(args, r.s.clockArg())
	return r.s.fcall(ctx, fnEdge, []string{r.s.edgeKey()}, args...).Result()
}

// publish tells the other processes that the gates changed.
func (r edgeRemote) publish(ctx context.Context) {
	_ = r.s.client.Publish(ctx, r.s.edgeChannel(), "1").Err()
}

func (r edgeRemote) Block(ctx context.Context, key string, strike bool, pause, first, max time.Duration, paced string) (edge.State, error) {
	// Tell the other processes at once, before the hash is written: a
	// block is the one change that must reach them before their next
	// request. The note carries the pause, so they need not read, and the
	// route the block's pace falls on.
	_ = r.s.client.Publish(ctx, r.s.edgeChannel(), "b\n"+strconv.FormatInt(millis(pause), 10)+"\n"+key+"\n"+paced).Err()
	v, err := r.run(ctx, "block", key, flag(strike), millis(pause), millis(first), millis(max), paced)
	if err != nil {
		return edge.State{}, err
	}
	st, err := parseEdgeState(v)
	if err == nil {
		r.publish(ctx)
	}
	return st, err
}

func (r edgeRemote) Probe(ctx context.Context, keys []string, id string) (bool, []edge.State, error) {
	v, err := r.run(ctx, "probe", strings.Join(keys, "\n"), id, millis(edge.Lease))
	if err != nil {
		return false, nil, err
	}
	if n, ok := v.(int64); ok && n == 1 {
		return true, nil, nil
	}
	sts, err := parseEdgeStates(v)
	return false, sts, err
}

func (r edgeRemote) Pass(ctx context.Context, keys []string, id string) error {
	if _, err := r.run(ctx, "pass", strings.Join(keys, "\n"), id); err != nil {
		return err
	}
	r.publish(ctx)
	return nil
}

func (r edgeRemote) Release(ctx context.Context, keys []string, id string, penalty time.Duration) error {
	if _, err := r.run(ctx, "release", strings.Join(keys, "\n"), id, millis(penalty)); err != nil {
		return err
	}
	r.publish(ctx)
	return nil
}

// Shared publishes a note, "s", the pause in milliseconds, the resource's
// digest in hexadecimal and the id of this Store, one per line: nothing is
// written, since a shared 429's wait is short and each process keeps its
// own copy.
func (r edgeRemote) Shared(ctx context.Context, res uint64, pause time.Duration) error {
	return r.s.client.Publish(ctx, r.s.edgeChannel(),
		"s\n"+strconv.FormatInt(millis(pause), 10)+"\n"+strconv.FormatUint(res, 16)+"\n"+r.s.id).Err()
}

// parseSharedNote reads the note of Shared.
func parseSharedNote(p string) (res uint64, pause time.Duration, from string, ok bool) {
	parts := strings.Split(p, "\n")
	if len(parts) != 4 || parts[0] != "s" {
		return 0, 0, "", false
	}
	ms, err1 := strconv.ParseInt(parts[1], 10, 64)
	res, err2 := strconv.ParseUint(parts[2], 16, 64)
	if err1 != nil || err2 != nil || ms <= 0 || ms > 86_400_000 || res == 0 {
		return 0, 0, "", false
	}
	return res, time.Duration(ms) * time.Millisecond, parts[3], true
}

// readGates replaces the process's copy of the gates with Redis's.
func (s *Store) readGates(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()
	at := time.Now()
	v, err := edgeRemote{s}.run(ctx, "read")
	if err != nil {
		return err
	}
	sts, err := parseEdgeStates(v)
	if err != nil {
		return err
	}
	s.gates.Replace(sts, at)
	return nil
}

// parseBlockNote reads the note a process publishes when it meets a block:
// "b", the pause in milliseconds, the gate's key and the route its pace
// falls on (which may be empty), one per line.
func parseBlockNote(p string) (edge.State, bool) {
	parts := strings.SplitN(p, "\n", 4)
	if len(parts) < 3 || parts[0] != "b" || parts[2] == "" {
		return edge.State{}, false
	}
	paced := ""
	if len(parts) == 4 {
		paced = parts[3]
	}
	ms, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || ms <= 0 || ms > 86_400_000 {
		return edge.State{}, false
	}
	return edge.State{Key: parts[2], Until: time.Duration(ms) * time.Millisecond, Paced: paced}, true
}

func parseEdgeStates(v any) ([]edge.State, error) {
	a, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: edge: %T %v", errReply, v, v)
	}
	out := make([]edge.State, 0, len(a))
	for _, x := range a {
		st, err := parseEdgeState(x)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

func parseEdgeState(v any) (edge.State, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 5 {
		return edge.State{}, fmt.Errorf("%w: edge state: %T %v", errReply, v, v)
	}
	key, ok := a[0].(string)
	if !ok {
		return edge.State{}, fmt.Errorf("%w: edge key: %T", errReply, a[0])
	}
	until, err1 := replyInt(a, 1)
	probe, err2 := replyInt(a, 2)
	strikes, err3 := replyInt(a, 3)
	if err1 != nil || err2 != nil || err3 != nil {
		return edge.State{}, fmt.Errorf("%w: edge state %v", errReply, a)
	}
	paced, ok := a[4].(string)
	if !ok {
		return edge.State{}, fmt.Errorf("%w: edge paced route: %T", errReply, a[4])
	}
	return edge.State{Key: key, Until: time.Duration(until) * time.Millisecond, Probe: time.Duration(probe) * time.Millisecond,
		Strikes: int(strikes), Paced: paced}, nil
}
