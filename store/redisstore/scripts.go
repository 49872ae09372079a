package redisstore

import (
	"context"
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
)

// The scripts are one Redis function library: Redis compiles it once and
// keeps its functions, so a call runs only its own work. (A script sent
// with EVAL would define the model and every helper again on each call,
// and the garbage that leaves, some 20 KB a call, costs Redis more than
// the call's work.) The library's name carries a digest of its source, so
// processes running different versions of it load and call their own.
var (
	libraryName   = "ratecord_" + sourceDigest()
	fnStep        = libraryName + "_step"
	fnEstimate    = libraryName + "_estimate"
	fnInvalid     = libraryName + "_invalid"
	fnEdge        = libraryName + "_edge"
	librarySource = "#!lua name=" + libraryName + "\n" + modelSource + commonSource + stepSource +
		estimateSource + invalidSource + edgeSource + register(fnStep, "stepMain") + register(fnEstimate, "estimateMain") +
		register(fnInvalid, "invalidMain") + register(fnEdge, "edgeMain")
)

func sourceDigest() string {
	h := sha1.Sum([]byte(modelSource + commonSource + stepSource + estimateSource + invalidSource + edgeSource))
	return hex.EncodeToString(h[:6])
}

// register is the library's line that makes main callable as name.
func register(name, main string) string {
	return "redis.register_function('" + name + "', function(keys, args) begin(keys, args) return " + main + "() end)\n"
}

// fcall calls the library's function fn, loading the library first when
// Redis does not have it (a server that restarted, a new cluster node).
func (s *Store) fcall(ctx context.Context, fn string, keys []string, args ...any) *redis.Cmd {
	cmd := s.client.FCall(ctx, fn, keys, args...)
	if err := cmd.Err(); err != nil && noFunction(err) {
		if lerr := s.loadLibrary(ctx); lerr != nil {
			return cmd
		}
		cmd = s.client.FCall(ctx, fn, keys, args...)
	}
	return cmd
}

// noFunction reports whether err is Redis's answer to a call of a
// function it does not have.
func noFunction(err error) bool {
	return redis.HasErrorPrefix(err, "ERR Function not found") || strings.Contains(err.Error(), "Function not found")
}

// loadLibrary loads the library on every server the client uses: each
// master of a cluster, each shard of a ring. A server that has it already
// keeps it.
func (s *Store) loadLibrary(ctx context.Context) error {
	load := func(ctx context.Context, c *redis.Client) error {
		err := c.FunctionLoad(ctx, librarySource).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, load)
	case *redis.Ring:
		return c.ForEachShard(ctx, load)
	case *redis.Client:
		return load(ctx, c)
	}
	err := s.client.FunctionLoad(ctx, librarySource).Err()
	if err != nil && strings.Contains(err.Error(), "already exists") {
		return nil
	}
	return err
}

// errReply reports a script reply of an unexpected shape.
var errReply = errors.New("redisstore: unexpected script reply")

// errStale reports a step call that Redis did not run because a later call
// of the same process was applied first: a late copy of a call whose reply
// was lost.
var errStale = errors.New("redisstore: a later call was applied first")

// Claim reply kinds.
const (
	replyGrant   = 0
	replyWait    = 1
	replyRefuse  = 2
	replyResolve = 3
)

// Scopes of a wait reply.
const (
	waitUser   = 1
	waitGlobal = 2
	waitPause  = 3
)

// claimReply is the parsed reply to one claim of a step.
type claimReply struct {
	kind int
	// replyGrant: count slots of bucket kind bkind, the last len(delays)
	// of which may be used that many milliseconds from the reply; the
	// claim's other waiters may claim again in at ms (0: at once).
	count, bkind int
	delays       []int64
	// limit is the granting (or, for a wait, the refusing) bucket's known
	// limit, 0 when unknown.
	limit int64
	// replyWait: ask again within at ms; the wait lasts bound ms at least
	// (0: unknown); scope says what holds it; with push, a push on line
	// may come first.
	at, bound int64
	scope     int
	push      bool
	line      string
	// replyRefuse: retry in milliseconds and reason code.
	retry  int64
	reason int
	// replyResolve: the route's hash ("" unknown, noBucket none).
	hash string
}

func parseClaim(a []any) (claimReply, error) {
	kind, err := replyInt(a, 0)
	if err != nil {
		return claimReply{}, err
	}
	r := claimReply{kind: int(kind)}
	switch r.kind {
	case replyGrant:
		var ints [5]int64
		for i := range ints {
			if ints[i], err = replyInt(a, 1+i); err != nil {
				return claimReply{}, err
			}
		}
		count, bkind, limit, next, reserved := ints[0], ints[1], ints[2], ints[3], ints[4]
		if count < 1 || bkind < kindLearned || bkind > kindNone || limit < 0 || next < 0 || reserved < 0 || reserved > count ||
			len(a) != 6+int(reserved) {
			return claimReply{}, fmt.Errorf("%w: claim: grant %v", errReply, a)
		}
		r.count, r.bkind, r.limit, r.at = int(count), int(bkind), limit, next
		for i := range int(reserved) {
			d, err := replyInt(a, 6+i)
			if err != nil || d < 0 {
				return claimReply{}, fmt.Errorf("%w: claim: grant %v", errReply, a)
			}
			r.delays = append(r.delays, d)
		}
	case replyWait:
		var ints [4]int64
		for i := range ints {
			if ints[i], err = replyInt(a, 1+i); err != nil {
				return claimReply{}, err
			}
		}
		at, bound, scope, push := ints[0], ints[1], ints[2], ints[3]
		line, ok := replyString(a, 5)
		if !ok || at < 0 || bound < 0 || scope < waitUser || scope > waitPause || len(a) > 7 {
			return claimReply{}, fmt.Errorf("%w: claim: wait %v", errReply, a)
		}
		if len(a) == 7 {
			// A bucket's wait names its limit when known.
			if r.limit, err = replyInt(a, 6); err != nil || r.limit < 0 {
				return claimReply{}, fmt.Errorf("%w: claim: wait %v", errReply, a)
			}
		}
		r.at, r.bound, r.scope, r.push, r.line = at, bound, int(scope), push == 1, line
	case replyRefuse:
		retry, err1 := replyInt(a, 1)
		reason, err2 := replyInt(a, 2)
		if err := errors.Join(err1, err2); err != nil {
			return claimReply{}, err
		}
		if retry < 0 || reason < 2 || reason > 3 {
			return claimReply{}, fmt.Errorf("%w: claim: refusal %v", errReply, a)
		}
		r.retry, r.reason = retry, int(reason)
	case replyResolve:
		h, ok := replyString(a, 1)
		if !ok {
			return claimReply{}, fmt.Errorf("%w: claim: resolve %v", errReply, a)
		}
		r.hash = h
	default:
		return claimReply{}, fmt.Errorf("%w: claim: kind %d", errReply, kind)
	}
	return r, nil
}

// Argument counts of step.lua, per entry.
const (
	callArgs    = 16
	undoKeys    = 2
	undoArgs    = 3
	reportKeys  = 8
	reportArgs  = 25
	claimKeys   = 8
	claimArgs   = 16
	leaveKeys   = 3
	leaveArgs   = 1
	maxReportMs = 60_000 // the oldest a report's age may say
)

// step is one call of step.lua for one credential: the calls it undoes,
// the reports it carries, then its claims. Its methods add them; run
// sends it.
type step struct {
	keys []string // the credential's keys, then each entry's
	args []any    // the call's, then each entry's, then the clock
	// reportArgs and claimArgs collect the entries' arguments apart, for
	// they follow the undone calls'.
	undo, reports, claims, leaves []any
	undoKeys, reportKeys          []string
	claimKeys, leaveKeys          []string
	nUndo, nReports               int
	nClaims, nLeaves              int
}

// undoCall adds a call whose reply was lost, to undo if it ran.
func (st *step) undoCall(s *Store, k credKeys, c *lostCall) {
	st.undo = append(st.undo, c.no, len(c.claims))
	for _, cl := range c.claims {
		st.undoKeys = append(st.undoKeys, k.bucket(cl.bid), k.bucket(cl.pid))
		st.undo = append(st.undo, cl.prefix, digest(cl.major), flag(cl.global))
	}
	st.nUndo++
}

// report adds the update u of permit h, the session's seq-th, which
// arrived age before the call.
func (st *step) report(s *Store, k credKeys, h *permit, u *store.Update, seq uint64, ageMs int64) {
	gid := bucketID(h.kind, h.hash, h.route, h.major)
	tid := gid
	if u.Bucket != "" {
		tid = learnedID(u.Bucket, h.major)
	}
	sid := digest(h.route, h.major, h.sub)
	st.reportKeys = append(st.reportKeys, k.dead(h.major), k.bucket(gid), k.bucket(tid), k.sublimit(sid),
		k.line(gid), k.tix(gid), k.line(tid), k.tix(tid))
	resetAfter := int64(-1)
	if u.ResetAfter >= 0 {
		resetAfter = millis(store.ClampDuration(u.ResetAfter))
	}
	offset := s.pol.ResetOffset
	cooldownMs := int64(-1)
	if s.pol.Cooldown > 0 {
		cooldownMs = millis(s.pol.Cooldown)
	}
	sent := 0
	switch {
	case u.Sent:
		sent = 1
	case h.lent:
		sent = 2
	}
	retry := millis(store.ClampDuration(u.RetryAfter) + offset)
	if u.Scope == store.ScopeShared && u.RetryAfter <= 0 {
		retry = 0 // the gates hold the resource (see edge.Gates.Settle)
	}
	st.reports = append(st.reports, seq,
		h.route, h.member, sent, u.Status, u.Bucket, flag(u.HasLimit),
		u.Limit, u.Remaining, resetAfter, string(u.Scope),
		retry, millis(offset),
		cooldownMs, flag(h.tokenAuth), h.kind, h.hash, flag(h.global),
		digest(h.major), flag(h.cred == store.Unauthenticated), h.sub,
		model.ResetMillis(u.Reset), min(max(ageMs, 0), maxReportMs), gid, tid, sid,
	)
	st.nReports++
}

// claim adds a claim of want slots for claims like c, and up to extra more
// for a lease, the route's hash guessed as guess; prefix names its permits.
// sole says which of this process's places in lines the claim's queue
// alone needs (soleGlobal, soleBucket): a claim that waits in one line
// gives up its place in the other only where no other queue of the
// process needs it.
func (st *step) claim(s *Store, k credKeys, c *store.Claim, guess string, want, extra int, prefix string, life int64, sole int) {
	bid := guessedID(guess, c.Route, c.Major) // for "", the probe's: the probe keys follow
	pid := probeID(c.Route, c.Major)
	sid := digest(c.Route, c.Major, c.Kind)
	st.claimKeys = append(st.claimKeys, k.dead(c.Major), k.bucket(bid), k.line(bid), k.tix(bid),
		k.bucket(pid), k.line(pid), k.tix(pid), k.sublimit(sid))
	st.claims = append(st.claims,
		c.Route, guess, flag(c.Global), flag(c.TokenAuth), want, extra, prefix, digest(c.Major),
		millis(store.ClampDuration(c.Spacing)), c.Kind, flag(c.Priority == store.PriorityUrgent), bid, pid, sid, life, sole,
	)
	st.nClaims++
}

// Bits of a claim's sole argument.
const (
	soleGlobal = 1 << iota // no other queue of the process waits with global claims
	soleBucket             // no other queue of the process waits in the bucket's line
)

// leave adds the line named name (a bucket's id, or globalLine) that this
// process gives its place up in.
func (st *step) leave(k credKeys, name string) {
	if name == globalLine {
		st.leaveKeys = append(st.leaveKeys, k.line(globalLine), k.tix(globalLine), k.global())
	} else {
		st.leaveKeys = append(st.leaveKeys, k.line(name), k.tix(name), k.bucket(name))
	}
	st.leaves = append(st.leaves, name)
	st.nLeaves++
}

// build joins the parts: the credential's keys k, the call's number and
// its arguments, then the entries, then the clock.
func (st *step) build(s *Store, k credKeys, tag string, no uint64, glimit int) {
	st.keys = append([]string{k.routes(), k.cred(), k.global(), k.probes(), k.proc(s.id), k.line(globalLine), k.tix(globalLine)},
		st.undoKeys...)
	st.keys = append(append(append(st.keys, st.reportKeys...), st.claimKeys...), st.leaveKeys...)
	st.args = []any{no, st.nUndo, st.nLeaves, s.id, s.channelPrefix(), st.nReports, st.nClaims,
		glimit, millis(s.pol.GlobalWindow), millis(s.pol.GlobalHold),
		millis(s.pendingTimeout), millis(bucketTTL), millis(routeTTL), millis(s.grace), millis(s.pushWait), tag}
	st.args = append(append(append(append(st.args, st.undo...), st.reports...), st.claims...), st.leaves...)
	st.args = append(st.args, s.clockArg())
}

// run sends the step.
func (st *step) run(ctx context.Context, s *Store) *redis.Cmd {
	return s.fcall(ctx, fnStep, st.keys, st.args...)
}

// stepReply is the parsed reply of step.lua.
type stepReply struct {
	wakes  []int64 // per report: ms until its bucket may grant by time alone, -1 none
	claims []claimReply
}

// parseStep parses the reply of a step of n reports and m claims.
func parseStep(v any, n, m int) (stepReply, error) {
	a, ok := v.([]any)
	if !ok || len(a) < 1 {
		return stepReply{}, fmt.Errorf("%w: step: %T %v", errReply, v, v)
	}
	if st, err := replyInt(a, 0); err != nil || st != 1 {
		if err == nil && st == -1 {
			return stepReply{}, errStale
		}
		return stepReply{}, fmt.Errorf("%w: step: %v", errReply, a)
	}
	if got, err := replyInt(a, 1); err != nil || got != int64(n) || len(a) < 3+n {
		return stepReply{}, fmt.Errorf("%w: step: %v", errReply, a)
	}
	r := stepReply{wakes: make([]int64, n)}
	for i := range n {
		w, err := replyInt(a, 2+i)
		if err != nil || w < -1 {
			return stepReply{}, fmt.Errorf("%w: step: report %d: %v", errReply, i, a)
		}
		r.wakes[i] = w
	}
	i := 2 + n
	if got, err := replyInt(a, i); err != nil || got != int64(m) {
		return stepReply{}, fmt.Errorf("%w: step: %v", errReply, a)
	}
	i++
	for range m {
		l, err := replyInt(a, i)
		if err != nil || l < 1 || i+1+int(l) > len(a) {
			return stepReply{}, fmt.Errorf("%w: step: claim at %d: %v", errReply, i, a)
		}
		c, err := parseClaim(a[i+1 : i+1+int(l)])
		if err != nil {
			return stepReply{}, err
		}
		r.claims = append(r.claims, c)
		i += 1 + int(l)
	}
	if i != len(a) {
		return stepReply{}, fmt.Errorf("%w: step: %d elements, want %d", errReply, len(a), i)
	}
	return r, nil
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

func replyString(a []any, i int) (string, bool) {
	if i >= len(a) {
		return "", false
	}
	s, ok := a[i].(string)
	return s, ok
}

// permitPrefix names the permits of one claim: the Store's id, the
// session's call number and the claim's place in the call.
func permitPrefix(id string, call uint64, i int) string {
	return id + ":" + strconv.FormatUint(call, 36) + ":" + strconv.Itoa(i) + ":"
}
