package redisstore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/internal/model"
)

var (
	//go:embed model.lua
	modelSource string
	//go:embed common.lua
	commonSource string
	//go:embed step.lua
	stepSource string
	//go:embed invalid.lua
	invalidSource string
	//go:embed estimate.lua
	estimateSource string
	//go:embed edge.lua
	edgeSource string

	// The scripts share the model and the helpers of common.lua: Redis
	// runs each script on its own, so they are joined before loading.
	stepScript     = redis.NewScript(modelSource + commonSource + stepSource)
	invalidScript  = redis.NewScript(modelSource + commonSource + invalidSource)
	estimateScript = redis.NewScript(modelSource + commonSource + estimateSource)
	edgeScript     = redis.NewScript(modelSource + commonSource + edgeSource)
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
	// limit is the granting bucket's known limit, 0 when unknown.
	limit int64
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
		if len(a) > 5 {
			l, err := replyInt(a, 5)
			if err != nil || l < 0 {
				return claimReply{}, fmt.Errorf("%w: claim: grant %v", errReply, a)
			}
			r.limit = l
		}
	case replyWait:
		sleep, err1 := replyInt(a, 1)
		bound, err2 := replyInt(a, 2)
		scope, err3 := replyInt(a, 3)
		if err := errors.Join(err1, err2, err3); err != nil {
			return claimReply{}, err
		}
		if sleep < 0 || bound < 0 || scope < 1 || scope > 4 {
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

// step is one call of step.lua: the updates of one credential's
// responses, then at most one claim. Its methods add them; run sends it.
type step struct {
	cred   string
	keys   []string // the credential's keys, then each update's and the claim's
	args   []any    // the counts, then each update's and the claim's, then the clock
	n      int      // updates
	claims bool
}

// begin names the credential's keys, once.
func (st *step) begin(s *Store, cred string) {
	if st.keys != nil {
		return
	}
	k := s.keysOf(cred)
	st.cred = cred
	st.keys = []string{k.routes(), k.cred(), k.global(), k.probes(), k.applied(s.id)}
	st.args = []any{0, 0}
}

// update adds the update u of permit h, this Store's seq-th, and returns
// the ids of the bucket h was granted from and of the bucket u concerns.
func (st *step) update(s *Store, h *permit, u store.Update, seq uint64) (gid, tid string) {
	st.begin(s, h.cred)
	k := s.keysOf(h.cred)
	gid = bucketID(h.kind, h.hash, h.route, h.major)
	tid = gid
	if u.Bucket != "" {
		tid = learnedID(u.Bucket, h.major)
	}
	st.keys = append(st.keys, k.dead(h.major), k.bucket(gid), k.bucket(tid), k.lastGrant(h.qid), k.sublimit(h.route, h.major, h.sub))
	resetAfter := int64(-1)
	if u.ResetAfter >= 0 {
		resetAfter = millis(store.ClampDuration(u.ResetAfter))
	}
	offset := s.pol.ResetOffset
	cooldownMs := int64(-1)
	if s.pol.Cooldown > 0 {
		cooldownMs = millis(s.pol.Cooldown)
	}
	st.args = append(st.args, seq,
		h.route, h.member, sentFlag(h, &u), u.Status, u.Bucket, flag(u.HasLimit),
		u.Limit, u.Remaining, resetAfter, string(u.Scope),
		millis(store.ClampDuration(u.RetryAfter)+offset), millis(offset),
		cooldownMs, flag(h.tokenAuth), h.kind, h.hash, flag(h.global),
		millis(bucketTTL), millis(routeTTL), digest(h.major), flag(h.cred == store.Unauthenticated), h.sub,
		model.ResetMillis(u.Reset),
	)
	st.n++
	return gid, tid
}

// claim adds a claim of n slots for claims like c, and up to extra more
// for a lease, the route's hash guessed as guess.
func (st *step) claim(s *Store, c *store.Claim, guess string, n, extra int, prefix, qid string) {
	st.begin(s, c.Credential)
	k := s.keysOf(c.Credential)
	pid := probeID(c.Route, c.Major)
	bid := guessedID(guess, c.Route, c.Major) // for "", the probe's: the probe keys follow
	st.keys = append(st.keys, k.dead(c.Major), k.bucket(bid), k.tickets(bid), k.ticketExp(bid), k.bucket(pid), k.lastGrant(qid),
		k.sublimit(c.Route, c.Major, c.Kind))
	st.args = append(st.args,
		c.Route, guess, flag(c.Global), s.pol.Limit(c), millis(s.pol.GlobalWindow),
		millis(s.pol.GlobalHold), flag(c.TokenAuth), n, prefix,
		millis(s.pendingTimeout), qid, millis(s.poll), millis(bucketTTL), millis(routeTTL),
		digest(c.Major), extra, millis(store.ClampDuration(c.Spacing)), c.Kind,
	)
	st.claims = true
}

// run sends the step through c: EVALSHA, and EVAL if Redis lacks the
// script.
func (st *step) run(ctx context.Context, c redis.Scripter, clock int64) *redis.Cmd {
	st.args[0], st.args[1] = st.n, flag(st.claims)
	return stepScript.Run(ctx, c, st.keys, append(st.args, clock)...)
}

// send adds the step to the pipeline p: EVALSHA, or EVAL when eval is true
// (a pipeline cannot fall back from one to the other by itself).
func (st *step) send(ctx context.Context, p redis.Pipeliner, clock int64, eval bool) *redis.Cmd {
	st.args[0], st.args[1] = st.n, flag(st.claims)
	if eval {
		return stepScript.Eval(ctx, p, st.keys, append(st.args, clock)...)
	}
	return stepScript.EvalSha(ctx, p, st.keys, append(st.args, clock)...)
}

// stepReply is the parsed reply of step.lua.
type stepReply struct {
	wakes []int64 // per update: ms until its bucket may grant by time alone, -1 none
	claim claimReply
}

// parseStep parses the reply of a step of n updates and, if claims, a
// claim.
func parseStep(v any, n int, claims bool) (stepReply, error) {
	a, ok := v.([]any)
	if !ok || len(a) < 1+n {
		return stepReply{}, fmt.Errorf("%w: step: %T %v", errReply, v, v)
	}
	got, err := replyInt(a, 0)
	if err != nil || got != int64(n) {
		return stepReply{}, fmt.Errorf("%w: step: %v", errReply, a)
	}
	r := stepReply{wakes: make([]int64, n)}
	for i := range n {
		w, err := replyInt(a, 1+i)
		if err != nil || w < -1 {
			return stepReply{}, fmt.Errorf("%w: step: update %d: %v", errReply, i, a)
		}
		r.wakes[i] = w
	}
	if claims {
		r.claim, err = parseClaim(a[1+n:])
	} else if len(a) != 1+n {
		err = fmt.Errorf("%w: step: %v", errReply, a)
	}
	return r, err
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

// sentFlag is the update's "sent" argument: 1 sent, 0 never sent, 2 a slot
// of a lease nobody used, 3 a slot a claim whose reply was lost may have
// granted.
func sentFlag(h *permit, u *store.Update) int {
	switch {
	case u.Sent:
		return 1
	case h.lent:
		return 2
	case h.qid != "":
		return 3
	}
	return 0
}
