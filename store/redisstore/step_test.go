package redisstore

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/ratecord/ratecord/store"
)

// stepClient returns a client of REDIS_ADDR (or 127.0.0.1:6379), skipping
// t without one, or failing it when CI is "true".
func stepClient(t *testing.T) *redis.Client {
	t.Helper()
	addr := os.Getenv("REDIS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:6379"
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		msg := "no Redis for this test: set REDIS_ADDR to a server's address (" + err.Error() + ")"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return c
}

// runStep sends st through c and parses its reply of ups updates.
func runStep(t *testing.T, s *Store, c *redis.Client, st *step, ups int) stepReply {
	t.Helper()
	v, err := st.run(t.Context(), c, s.clockArg()).Result()
	if err != nil {
		t.Fatalf("step: %v", err)
	}
	r, err := parseStep(v, ups, st.claims)
	if err != nil {
		t.Fatalf("step reply: %v", err)
	}
	return r
}

// TestStepAppliesUpdatesOnce sends the same update twice, as the outbox
// does after a call that timed out but ran: the second is skipped, so a
// slot given back once is not given back twice.
func TestStepAppliesUpdatesOnce(t *testing.T) {
	c := stepClient(t)
	s := New(c, WithPrefix("ratecordtest:step:"+time.Now().Format(time.RFC3339Nano)))
	t.Cleanup(func() { s.Close() })
	claim := &store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}

	run := func(st *step, ups int) stepReply { t.Helper(); return runStep(t, s, c, st, ups) }
	claimOnly := func(guess string, n int) claimReply {
		var st step
		st.claim(s, claim, guess, n, 0, s.nextID()+":", "q")
		return run(&st, 0).claim
	}

	// A probe, whose response names the bucket: 2 per 10 s, 1 left.
	r := claimOnly("", 1)
	if r.kind != replyGrant || r.count != 1 || r.bkind != kindProbe {
		t.Fatalf("first claim = %+v; want one probe slot", r)
	}
	probe := &permit{cred: "bot", route: claim.Route, major: claim.Major, kind: kindProbe, member: "p1"}
	learned := store.Update{Sent: true, Status: 200,
		Bucket: "h", HasLimit: true, Limit: 2, Remaining: 1, ResetAfter: 10 * time.Second}
	var st step
	st.update(s, probe, learned, 1)
	run(&st, 1)

	// The last slot of the window, never sent: its give-back is sent twice.
	r = claimOnly("h", 1)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of the last slot = %+v; want one slot", r)
	}
	unsent := &permit{cred: "bot", route: claim.Route, major: claim.Major, kind: kindLearned, hash: "h", member: "p2"}
	back := store.Update{}
	for range 2 {
		var st step
		st.update(s, unsent, back, 2)
		run(&st, 1)
	}

	// One slot came back, not two.
	r = claimOnly("h", 2)
	if r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of 2 after one slot was given back twice with the same number = %+v; want 1 slot", r)
	}
	// And a later update still applies.
	var st2 step
	st2.update(s, &permit{cred: "bot", route: claim.Route, major: claim.Major, kind: kindLearned, hash: "h", member: "p3"}, back, 3)
	run(&st2, 1)
	if r = claimOnly("h", 2); r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim after a newer give-back = %+v; want 1 slot", r)
	}
}

// TestOrphanGiveBackOnlyIfClaimRan gives back the slots of a claim whose
// reply was lost: Redis takes them back only if that claim ran, so a claim
// that never reached Redis adds no slot.
func TestOrphanGiveBackOnlyIfClaimRan(t *testing.T) {
	c := stepClient(t)
	s := New(c, WithPrefix("ratecordtest:orphan:"+time.Now().Format(time.RFC3339Nano)))
	t.Cleanup(func() { s.Close() })
	claim := &store.Claim{Credential: "bot", Route: "POST /channels/:id/messages", Major: "channels/1"}
	run := func(st *step, ups int) stepReply { t.Helper(); return runStep(t, s, c, st, ups) }
	seq := uint64(0)
	claimAs := func(guess, prefix string) claimReply {
		var st step
		st.claim(s, claim, guess, 1, 0, prefix, "q")
		return run(&st, 0).claim
	}
	giveBack := func(member string) {
		var st step
		seq++
		h := &permit{cred: "bot", route: claim.Route, major: claim.Major, kind: kindLearned, hash: "h", member: member, qid: "q"}
		st.update(s, h, store.Update{}, seq)
		run(&st, 1)
	}
	if r := claimAs("", "probe:"); r.kind != replyGrant {
		t.Fatalf("probe claim = %+v", r)
	}
	var st step
	seq++
	st.update(s, &permit{cred: "bot", route: claim.Route, major: claim.Major, kind: kindProbe, member: "probe:1"},
		store.Update{Sent: true, Status: 200,
			Bucket: "h", HasLimit: true, Limit: 2, Remaining: 1, ResetAfter: 10 * time.Second}, seq)
	run(&st, 1)
	if r := claimAs("h", "ran:"); r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim of the last slot = %+v; want one slot", r)
	}
	giveBack("lost:1") // a claim that never ran
	if r := claimAs("h", "next:"); r.kind == replyGrant {
		t.Fatalf("claim after giving back a slot of a claim that never ran = %+v; want a wait", r)
	}
	giveBack("ran:1") // the claim that ran: its slot comes back
	if r := claimAs("h", "again:"); r.kind != replyGrant || r.count != 1 {
		t.Fatalf("claim after giving back the slot of the claim that ran = %+v; want one slot", r)
	}
}
