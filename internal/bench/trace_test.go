package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

func TestOnRoute(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		route, major, method, path string
		want                       bool
	}{
		{"POST /channels/{channel_id}/messages", "channels/100", "POST", "/channels/100/messages", true},
		{"POST /channels/{channel_id}/messages", "channels/101", "POST", "/channels/100/messages", false},
		{"POST /channels/{channel_id}/messages", "channels/100", "GET", "/channels/100/messages", false},
		{"POST /channels/{channel_id}/messages", "channels/100", "POST", "/channels/100/messages/5", false},
		{"POST /channels/{channel_id}/messages", "", "POST", "/guilds/100/messages", false},
		{"POST /webhooks/{webhook_id}/{webhook_token}", "webhooks/700/REDACTED", "POST", "/webhooks/700/hook-token-0", true},
		{"POST /webhooks/{webhook_id}/{webhook_token}", "webhooks/701/REDACTED", "POST", "/webhooks/700/hook-token-0", false},
		{"GET /nowhere/REDACTED", "", "GET", "/nowhere/secret", true},
		{"GET /users/@me", "", "GET", "/users/@me", true},
	} {
		if got := onRoute(tt.route, tt.major, tt.method, tt.path); got != tt.want {
			t.Errorf("onRoute(%q, %q, %s %s) = %v; want %v", tt.route, tt.major, tt.method, tt.path, got, tt.want)
		}
	}
}

// TestExplain: an avoidable 429 is matched with the attempt whose answer
// came back when the emulator's reached the client, among those of its
// route and scope sent before it arrived; the trace says how long after
// its process woke it left and how many attempts that process sent just
// after waking.
func TestExplain(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	const route = "POST /channels/{channel_id}/messages"
	log := []discordtest.LogEntry{
		{Time: at(1000 * ms), Reached: at(1040 * ms), Route: route, Major: "channels/1", Status: 429, Scope: "global", Avoidable: true, RetryAfter: 200 * ms},
		{Time: at(1001 * ms), Reached: at(1041 * ms), Route: route, Major: "channels/1", Status: 429, Scope: "global"}, // unavoidable
		{Time: at(1002 * ms), Route: route, Status: 200},
		{Time: at(3000 * ms), Reached: at(3030 * ms), Route: "GET /users/@me", Status: 429, Scope: "user", Avoidable: true},
		{Time: at(5000 * ms), Reached: at(5030 * ms), Route: "GET /gateway", Status: 429, Scope: "global", Avoidable: true},
	}
	attempts := []Attempt{
		// Part 1 woke at 990 ms and sent three at once.
		{Part: 1, Method: "POST", Path: "/channels/1/messages", Sent: at(991 * ms), Got: at(1041 * ms), Status: 429, Scope: "global"},
		{Part: 1, Method: "POST", Path: "/channels/1/messages", Sent: at(992 * ms), Got: at(1060 * ms), Status: 200},
		{Part: 1, Method: "POST", Path: "/channels/1/messages", Sent: at(993 * ms), Got: at(1045 * ms), Status: 429, Scope: "global"},
		// Part 0: same route and scope, but its answer came back far from
		// when the avoidable one's reached the client.
		{Part: 0, Method: "POST", Path: "/channels/1/messages", Sent: at(980 * ms), Got: at(1200 * ms), Status: 429, Scope: "global"},
		// Sent after the entry arrived: not a candidate.
		{Part: 0, Method: "POST", Path: "/channels/1/messages", Sent: at(1001 * ms), Got: at(1040 * ms), Status: 429, Scope: "global"},
		// Given up at the end of the run, no answer.
		{Part: 2, Method: "GET", Path: "/gateway", Sent: at(4960 * ms), Got: at(5010 * ms)},
	}
	freezes := []Freeze{
		{Part: 1, Start: at(100 * ms), Length: 890 * ms},
		{Part: 2, Start: at(500 * ms), Length: 600 * ms},
	}
	r := Result{Scenario: "s", Limiter: "l", Run: 3, Avoidable: 3}
	events := []StoreEvent{
		{Part: 1, At: at(500 * ms), Msg: "old"},
		{Part: 1, At: at(985 * ms), Msg: "ratecord: redis unavailable, limiting locally"},
		{Part: 0, At: at(990 * ms), Msg: "another process's"},
		{Part: 1, At: at(995 * ms), Msg: "after the send"},
	}
	tr := traced{attempts: attempts, freezes: freezes, events: events, errKinds: map[string]int{"e": 1}}
	got := explain(r, t0, log, tr)
	if len(got) != 3 {
		t.Fatalf("explained %d 429s; want the 3 avoidable ones: %+v", len(got), got)
	}
	g := got[0]
	if g.Part != 1 || g.Sent != 991 || g.Candidates != 3 || g.Scope != "global" || g.Run != 3 {
		t.Errorf("first: part %d sent at %v ms, %d candidates, scope %q, run %d; want part 1 at 991 ms, 3 candidates, global, run 3",
			g.Part, g.Sent, g.Candidates, g.Scope, g.Run)
	}
	if g.NoAnswer {
		t.Error("first: matched an attempt without an answer")
	}
	if got[2].Part != 2 || !got[2].NoAnswer || got[2].Candidates != 1 {
		t.Errorf("third: %+v; want part 2's attempt that got no answer", got[2])
	}
	if g.SinceWake != 1 || g.FrozenFor != 890 || g.Burst != 3 || g.FrozenInFlight {
		t.Errorf("first: %v ms after a wake from %v ms frozen, %d sent just after waking, frozen in flight %v; want 1, 890, 3, false",
			g.SinceWake, g.FrozenFor, g.Burst, g.FrozenInFlight)
	}
	if g.Event != "ratecord: redis unavailable, limiting locally" || g.SinceEvent != 6 {
		t.Errorf("first: store event %q %v ms before; want the fallback 6 ms before", g.Event, g.SinceEvent)
	}
	if len(g.Woken) != 1 || g.Woken[0].Part != 2 || g.Woken[0].Before != -100 || g.Woken[0].FrozenFor != 600 {
		t.Errorf("first: others frozen %+v; want part 2, woken 100 ms after, frozen 600 ms", g.Woken)
	}
	if got[1].Part != -1 || got[1].Candidates != 0 || got[1].Route != "GET /users/@me" {
		t.Errorf("second: %+v; want no attempt matched", got[1])
	}
	var out bytes.Buffer
	if err := writeTrace(&out, r, t0, log, tr); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 {
		t.Fatalf("%d lines; want a run line and 3 429 lines:\n%s", len(lines), out.String())
	}
	var run traceRun
	if err := json.Unmarshal([]byte(lines[0]), &run); err != nil || run.Type != "run" || len(run.Freezes) != 2 || run.Freezes[0].Length != 890 || run.Errors["e"] != 1 || len(run.Events) != 4 {
		t.Errorf("run line %s: %+v, %v", lines[0], run, err)
	}
}

// TestTraceRecordsAttempts: with tracing on, a worker records each request
// it sends, with its part and the path without the API prefix; without,
// none.
func TestTraceRecordsAttempts(t *testing.T) {
	t.Parallel()
	sc, err := pick(discordtest.LANNetwork(), "saturate")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := discordtest.Start(append(sc[0].Emulator, discordtest.WithNetwork(discordtest.LANNetwork()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	for _, traced := range []bool{false, true} {
		ctx := t.Context()
		if traced {
			ctx = withTrace(ctx)
		}
		ctx, cancel := runContext(ctx, 300*time.Millisecond)
		rec := &recorder{}
		RunLoad(ctx, runID("saturate", "ratecord"), sc[0], Ratecord(), srv.URL(), 2, 3, rec)
		cancel()
		rep := rec.report()
		if !traced {
			if len(rep.Attempts) != 0 {
				t.Errorf("%d attempts recorded without tracing", len(rep.Attempts))
			}
			continue
		}
		if len(rep.Attempts) == 0 {
			t.Fatal("no attempt recorded with tracing")
		}
		for _, a := range rep.Attempts {
			if a.Part != 2 || a.Method != "POST" || a.Path != "/channels/100/messages" || a.Got.Before(a.Sent) || a.Sent.IsZero() {
				t.Fatalf("attempt %+v; want part 2, POST /channels/100/messages, sent before got", a)
			}
		}
	}
}

// TestErrorKinds: errors are counted by message with digits masked, in at
// most maxErrorKinds kinds, and only when the run is traced.
func TestErrorKinds(t *testing.T) {
	t.Parallel()
	if got := errorKind(errors.New("wait 1.25s exceeds 500ms")); got != "wait #.#s exceeds #ms" {
		t.Errorf("errorKind = %q", got)
	}
	ue := &url.Error{Op: "Get", URL: "http://127.0.0.1:4321/api/v10/users/@me", Err: errors.New("gave up after 12ms")}
	if got := errorKind(fmt.Errorf("send: %w", ue)); got != "gave up after #ms" {
		t.Errorf("errorKind of a url.Error = %q", got)
	}
	r := &recorder{}
	r.traceError(errors.New("x"))
	if len(r.errKinds) != 0 {
		t.Errorf("untraced run counted %v", r.errKinds)
	}
	r.tracing = true
	r.traceError(errors.New("took 12ms"))
	r.traceError(errors.New("took 993ms"))
	if r.errKinds["took #ms"] != 2 {
		t.Errorf("kinds %v; want took #ms twice", r.errKinds)
	}
	for i := range 2 * maxErrorKinds {
		r.traceError(errors.New(strings.Repeat("x", i+1)))
	}
	if len(r.errKinds) != maxErrorKinds+1 || r.errKinds["other"] != maxErrorKinds+1 {
		t.Errorf("%d kinds, %d other; want %d kinds, %d other", len(r.errKinds), r.errKinds["other"], maxErrorKinds+1, maxErrorKinds+1)
	}
}

// TestEventHandler: what a store logs is recorded as an event of the
// worker, its attributes in the message.
func TestEventHandler(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	l := slog.New(&eventHandler{rec: rec, part: 3}).With("store", "redis")
	l.Warn("ratecord: redis unavailable, limiting locally", "err", errors.New("dial: refused"))
	if len(rec.events) != 1 {
		t.Fatalf("events = %+v; want 1", rec.events)
	}
	e := rec.events[0]
	if e.Part != 3 || e.At.IsZero() || e.Msg != "ratecord: redis unavailable, limiting locally store=redis err=dial: refused" {
		t.Errorf("event %+v", e)
	}
}
