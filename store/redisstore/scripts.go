package redisstore

import (
	_ "embed"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed model.lua
	modelSource string
	//go:embed common.lua
	commonSource string
	//go:embed claim.lua
	claimSource string
	//go:embed update.lua
	updateSource string
	//go:embed invalid.lua
	invalidSource string

	// The scripts share the model and the helpers of common.lua: Redis
	// runs each script on its own, so they are joined before loading.
	claimScript   = redis.NewScript(modelSource + commonSource + claimSource)
	updateScript  = redis.NewScript(modelSource + commonSource + updateSource)
	invalidScript = redis.NewScript(modelSource + commonSource + invalidSource)
)

// errReply reports a script reply of an unexpected shape.
var errReply = errors.New("redisstore: unexpected script reply")

// Claim reply kinds.
const (
	replyGrant   = 0
	replyWait    = 1
	replyRefuse  = 2
	replyResolve = 3
)

// claimReply is the parsed reply of claim.lua.
type claimReply struct {
	kind int
	// replyGrant: count slots of bucket kind bkind, which may be used
	// delay milliseconds from now.
	count, bkind int
	delay        int64
	// ticket reports whether the queue holds a ticket in the bucket's line.
	ticket bool
	// replyWait: sleep and lower bound in milliseconds, scope code.
	sleep, bound int64
	scope        int
	// replyRefuse: retry in milliseconds and reason code.
	retry  int64
	reason int
	// replyResolve: the route's hash ("" unknown, noBucket none).
	hash string
}

func parseClaim(v any) (claimReply, error) {
	a, ok := v.([]any)
	if !ok || len(a) == 0 {
		return claimReply{}, fmt.Errorf("%w: claim: %T %v", errReply, v, v)
	}
	kind, err := replyInt(a, 0)
	if err != nil {
		return claimReply{}, err
	}
	r := claimReply{kind: int(kind)}
	switch r.kind {
	case replyGrant:
		count, err1 := replyInt(a, 1)
		bkind, err2 := replyInt(a, 2)
		if err := errors.Join(err1, err2); err != nil {
			return claimReply{}, err
		}
		if count < 1 || bkind < kindLearned || bkind > kindNone {
			return claimReply{}, fmt.Errorf("%w: claim: grant %v", errReply, a)
		}
		r.count, r.bkind = int(count), int(bkind)
		if t, err := replyInt(a, 3); err == nil {
			r.ticket = t == 1
		}
		if len(a) > 4 {
			d, err := replyInt(a, 4)
			if err != nil {
				return claimReply{}, err
			}
			if d < 0 || d > 0 && count != 1 {
				return claimReply{}, fmt.Errorf("%w: claim: grant %v", errReply, a)
			}
			r.delay = d
		}
	case replyWait:
		sleep, err1 := replyInt(a, 1)
		bound, err2 := replyInt(a, 2)
		scope, err3 := replyInt(a, 3)
		if err := errors.Join(err1, err2, err3); err != nil {
			return claimReply{}, err
		}
		if sleep < 0 || bound < 0 || scope < 1 || scope > 3 {
			return claimReply{}, fmt.Errorf("%w: claim: wait %v", errReply, a)
		}
		r.sleep, r.bound, r.scope = sleep, bound, int(scope)
		if len(a) > 4 {
			t, err := replyInt(a, 4)
			if err != nil {
				return claimReply{}, err
			}
			r.ticket = t == 1
		}
	case replyRefuse:
		retry, err1 := replyInt(a, 1)
		reason, err2 := replyInt(a, 2)
		if err := errors.Join(err1, err2); err != nil {
			return claimReply{}, err
		}
		if retry < 0 || reason < 1 || reason > 3 {
			return claimReply{}, fmt.Errorf("%w: claim: refusal %v", errReply, a)
		}
		r.retry, r.reason = retry, int(reason)
	case replyResolve:
		if len(a) < 2 {
			return claimReply{}, fmt.Errorf("%w: claim: resolve %v", errReply, a)
		}
		h, ok := a[1].(string)
		if !ok {
			return claimReply{}, fmt.Errorf("%w: claim: resolve %v", errReply, a)
		}
		r.hash = h
	default:
		return claimReply{}, fmt.Errorf("%w: claim: kind %d", errReply, kind)
	}
	return r, nil
}

// parseUpdate returns the wake hint of update.lua's reply, in ms (-1:
// none).
func parseUpdate(v any) (int64, error) {
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return 0, fmt.Errorf("%w: update: %T %v", errReply, v, v)
	}
	n, err1 := replyInt(a, 0)
	wake, err2 := replyInt(a, 1)
	if err1 != nil || err2 != nil || n != 1 || wake < -1 {
		return 0, fmt.Errorf("%w: update: %v", errReply, a)
	}
	return wake, nil
}

func replyInt(a []any, i int) (int64, error) {
	if i >= len(a) {
		return 0, fmt.Errorf("%w: %d elements, want more than %d", errReply, len(a), i)
	}
	n, ok := a[i].(int64)
	if !ok {
		return 0, fmt.Errorf("%w: element %d is %T, want an integer", errReply, i, a[i])
	}
	return n, nil
}
