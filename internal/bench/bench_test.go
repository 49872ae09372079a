package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/ratecord/ratecord/discordtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func entries(major string, t0 time.Time, offsets ...time.Duration) []discordtest.LogEntry {
	var log []discordtest.LogEntry
	for _, o := range offsets {
		log = append(log, discordtest.LogEntry{Time: t0.Add(o), Major: major, Credential: "c"})
	}
	return log
}

func TestFixedLate(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t0 := time.Unix(0, 0)
	// Limit 2 per 100 ms: the third request waited for the window that
	// closed at 100 ms and came 7 ms late; the fifth came 3 ms late; the
	// window after the sixth was not full, so its successor did not wait.
	log := entries("channels/1", t0, 0, 1*ms, 107*ms, 108*ms, 210*ms, 400*ms)
	got := fixedLate(2, 100*ms)(log)
	want := []time.Duration{7 * ms, 3 * ms}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("fixedLate = %v; want %v", got, want)
	}
}

func TestGlobalLate(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t0 := time.Unix(0, 0)
	// 2 per second, saturated: the third request's slot opened at 1000 ms
	// (the first plus a second) and it came at 1004 ms; the fourth's opened
	// at 1010 ms and it came at 1012 ms.
	log := entries("", t0, 0, 10*ms, 1004*ms, 1012*ms)
	got := globalLate(2, time.Second)(log)
	if len(got) != 2 || got[0] != 4*ms || got[1] != 2*ms {
		t.Errorf("globalLate = %v; want [4ms 2ms]", got)
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	ds := []time.Duration{5 * time.Millisecond, 1 * time.Millisecond, 3 * time.Millisecond, 2 * time.Millisecond}
	if got := percentileMS(ds, 0.5); got != 2 {
		t.Errorf("p50 = %v; want 2", got)
	}
	if got := percentileMS(ds, 1); got != 5 {
		t.Errorf("max = %v; want 5", got)
	}
	if got := percentileMS(nil, 0.5); !math.IsNaN(got) {
		t.Errorf("p50 of nothing = %v; want NaN", got)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	ok := []Result{{Scenario: "a", Limiter: "ratecord"}, {Scenario: "a", Limiter: "none", Avoidable: 9, Bans: 1}}
	if err := Check(ok); err != nil {
		t.Errorf("Check(%+v) = %v; want nil (only ratecord rows count)", ok, err)
	}
	for _, bad := range []Result{
		{Scenario: "a", Limiter: "ratecord", Avoidable: 1},
		{Scenario: "a", Limiter: "ratecord", Bans: 1},
		{Scenario: "deadline", Limiter: "ratecord", OverN: 3, OverMax: 5.5},
		{Scenario: "deadline", Limiter: "ratecord", User: 1},
	} {
		if err := Check([]Result{bad}); err == nil {
			t.Errorf("Check(%+v) = nil; want an error", bad)
		}
	}
}

// TestScenarioRuns runs one short scenario end to end: the emulator, the
// load, the summary. It asserts only what must hold on any machine.
func TestScenarioRuns(t *testing.T) {
	sc, err := pick(discordtest.LANNetwork(), "shared-hash")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Run(context.Background(), sc, []Limiter{Ratecord()}, Options{Duration: 1200 * time.Millisecond, Network: discordtest.LANNetwork()})
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.Successes == 0 || r.Requests < r.Successes || r.MaxPerSecond <= 0 {
		t.Errorf("result %+v: want successes counted against a maximum", r)
	}
	if r.Avoidable != 0 || r.Bans != 0 {
		t.Errorf("ratecord got %d avoidable 429s and %d bans; want none", r.Avoidable, r.Bans)
	}
}

// fakeRuns returns n good runs of ratecord on scenario "saturate" with the
// given runs (numbered from 1) replaced.
func fakeRuns(n int, bad map[int]Result) []Result {
	var rs []Result
	for i := 1; i <= n; i++ {
		r, ok := bad[i]
		if !ok {
			r = Result{Successes: 100, PerSecond: 40, MaxPerSecond: 40, Utilization: 1, LateP50: math.NaN(), LateP99: math.NaN(),
				OverP50: math.NaN(), OverP99: math.NaN(), OverMax: math.NaN(), late: []time.Duration{time.Duration(i) * time.Millisecond}}
		}
		r.Scenario, r.Limiter, r.Run, r.Procs = "saturate", "ratecord", i, 1
		rs = append(rs, r)
	}
	return rs
}

func TestRepeatAggregation(t *testing.T) {
	t.Parallel()
	rs := fakeRuns(20, map[int]Result{7: {Successes: 90, PerSecond: 36, MaxPerSecond: 40, Utilization: 0.9, Avoidable: 2, User: 2,
		LateP50: math.NaN(), LateP99: math.NaN(), OverP50: math.NaN(), OverP99: math.NaN(), OverMax: math.NaN()}})
	rs = append(rs, Result{Scenario: "saturate", Limiter: "none", Run: 1, Avoidable: 400})
	rows := Aggregate(rs)
	if len(rows) != 2 {
		t.Fatalf("Aggregate made %d rows; want 2 (ratecord, none)", len(rows))
	}
	r := rows[0]
	if r.Runs != 20 || r.AvoidableRuns != 1 || r.FailedRuns != 1 || r.Avoidable != 2 || r.User != 2 || r.Successes != 19*100+90 {
		t.Errorf("row = runs %d, avoidable runs %d, failed runs %d, avoidable %d, user %d, successes %d; want 20, 1, 1, 2, 2, 1990",
			r.Runs, r.AvoidableRuns, r.FailedRuns, r.Avoidable, r.User, r.Successes)
	}
	if want := (19*1 + 0.9) / 20; math.Abs(r.Utilization-want) > 1e-9 || r.MinUtilization != 0.9 {
		t.Errorf("utilization %v, min %v; want the mean %v and 0.9", r.Utilization, r.MinUtilization, want)
	}
	// Lateness pools the samples of every run: 1..6, 8..20 ms.
	if r.LateP50 != 11 || r.LateP99 != 20 {
		t.Errorf("late p50 %v p99 %v; want 11, 20 over the pooled samples", r.LateP50, r.LateP99)
	}

	var table bytes.Buffer
	PrintTable(&table, rows)
	if !strings.Contains(table.String(), "2 (1/20 runs)") || !strings.Contains(table.String(), "min util") {
		t.Errorf("table does not show the one run of twenty with avoidable 429s:\n%s", table.String())
	}

	var out bytes.Buffer
	if err := json.NewEncoder(&out).Encode(sanitize(rows)); err != nil {
		t.Fatalf("encoding rows: %v", err)
	}
	var back []struct {
		Runs   int `json:"runs"`
		PerRun []struct {
			Run       int `json:"run"`
			Avoidable int `json:"avoidable_429"`
		} `json:"per_run"`
	}
	if err := json.Unmarshal(out.Bytes(), &back); err != nil {
		t.Fatalf("decoding %s: %v", out.Bytes(), err)
	}
	if len(back[0].PerRun) != 20 || back[0].PerRun[6].Run != 7 || back[0].PerRun[6].Avoidable != 2 {
		t.Errorf("JSON per-run figures = %+v; want 20 runs, run 7 with 2 avoidable 429s", back[0].PerRun)
	}
}

func TestCheckFailsOnOneBadRun(t *testing.T) {
	t.Parallel()
	for _, bad := range []Result{
		{Avoidable: 1},
		{Bans: 1},
		{OverN: 1, OverMax: 7},
	} {
		rs := fakeRuns(20, map[int]Result{13: bad})
		err := Check(rs)
		if err == nil || !strings.Contains(err.Error(), "run 13") {
			t.Errorf("Check(20 runs, run 13 = %+v) = %v; want an error naming run 13", bad, err)
		}
	}
	if err := Check(fakeRuns(20, nil)); err != nil {
		t.Errorf("Check(20 good runs) = %v; want nil", err)
	}
}

func TestMeasuredFromFirstArrival(t *testing.T) {
	t.Parallel()
	start := time.Unix(1000, 0)
	ms := time.Millisecond
	// A limit of 2 per 500 ms, a run of 1 s; the first success arrived
	// 100 ms in (the network's way up), so the span measured is 900 ms:
	// two windows, at most 4 successes.
	sc := Scenario{Name: "x", Max: span(func(d time.Duration) float64 { return 2 * windows(d, 500*ms) })}
	var log []discordtest.LogEntry
	for _, off := range []time.Duration{90 * ms, 100 * ms, 101 * ms, 610 * ms, 611 * ms, 1100 * ms} {
		st := 200
		if off == 90*ms {
			st = 429
		}
		log = append(log, discordtest.LogEntry{Time: start.Add(off), Status: st})
	}
	r := summarize(sc, "ratecord", 1, start, time.Second, discordtest.Stats{Log: log}, &recorder{})
	if r.Warmup != 0.1 || r.Successes != 4 || r.Utilization != 1 || math.Abs(r.MaxPerSecond-4/0.9) > 1e-9 {
		t.Errorf("summarize = warmup %v, successes %d, utilization %v, max/s %v; want 0.1, 4, 1, %v",
			r.Warmup, r.Successes, r.Utilization, r.MaxPerSecond, 4/0.9)
	}
}

func TestDeadlineScalesWithTheNetwork(t *testing.T) {
	t.Parallel()
	for _, name := range discordtest.NetworkProfiles() {
		n, _ := discordtest.NetworkProfile(name)
		sc, err := pick(n, "deadline")
		if err != nil {
			t.Fatal(err)
		}
		if want := 50*time.Millisecond + n.MaxRoundTrip(); sc[0].Deadline != want {
			t.Errorf("deadline on %s = %v; want %v", name, sc[0].Deadline, want)
		}
	}
}

// edgeAwareClient is the client the edge-block scenario asks for, built
// only to show that the scenario can be passed: it keeps each bot under its
// bucket (8 per second), stops for a second after every header-less 429
// and then sends one probe at a time until a response is not one.
type edgeAwareClient struct {
	c       *http.Client
	mu      sync.Mutex // guards the fields below
	next    map[string]time.Time
	blocked time.Time // no request before this
	lastHit time.Time // when the latest block response came
	probing bool      // after a block response, until a probe's response is not one
	flying  int
}

func (e *edgeAwareClient) Do(ctx context.Context, method, url, auth string, body []byte) (int, error) {
	e.mu.Lock()
	slot := time.Now()
	if n := e.next[auth]; n.After(slot) {
		slot = n
	}
	e.next[auth] = slot.Add(125 * time.Millisecond)
	e.mu.Unlock()
	sleep(ctx, time.Until(slot))
	for {
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		e.mu.Lock()
		wait := time.Until(e.blocked)
		if wait <= 0 && !(e.probing && e.flying > 0) {
			e.flying++
			slot = time.Now()
			e.mu.Unlock()
			break
		}
		e.mu.Unlock()
		sleep(ctx, max(wait, time.Millisecond))
	}
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	req.Header.Set("Authorization", auth)
	resp, err := e.c.Do(req)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.flying--
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests && resp.Header.Get("Via") == "" && resp.Header.Get("X-RateLimit-Scope") == "" {
		e.lastHit = time.Now()
		e.blocked, e.probing = e.lastHit.Add(time.Second), true
	} else if slot.After(e.lastHit) {
		// A request sent before the latest block response says nothing
		// of whether the block has ended.
		e.probing = false
	}
	return resp.StatusCode, nil
}

func (e *edgeAwareClient) Close() error { return nil }

// TestEdgeBlockCanBePassed runs the edge-block scenario with a client that
// stops at the first block response and then probes once a second: it is
// blocked, yet gets no avoidable 429 and no ban, on a LAN and at Discord's
// latency.
func TestEdgeBlockCanBePassed(t *testing.T) {
	for _, name := range []string{discordtest.ProfileLAN, discordtest.ProfileDiscord} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			n, _ := discordtest.NetworkProfile(name)
			sc, err := pick(n, "edge-block")
			if err != nil {
				t.Fatal(err)
			}
			lim := Limiter{Name: "edge-aware", New: func(base http.RoundTripper, _ ClientConfig) Client {
				return &edgeAwareClient{c: &http.Client{Transport: base}, next: map[string]time.Time{}}
			}}
			rs, err := Run(context.Background(), sc, []Limiter{lim}, Options{Duration: 2500 * time.Millisecond, Network: n})
			if err != nil {
				t.Fatal(err)
			}
			r := rs[0]
			if r.Edge == 0 || r.Successes == 0 {
				t.Errorf("%d edge 429s, %d successes; want the edge limit to block a client sending 24 per second", r.Edge, r.Successes)
			}
			if r.Avoidable != 0 || r.Bans != 0 || r.Banned != 0 {
				t.Errorf("%d avoidable 429s (%d edge), %d bans; want none", r.Avoidable, r.Edge, r.Bans)
			}
		})
	}
}

func TestScenarioSets(t *testing.T) {
	t.Parallel()
	n := discordtest.LANNetwork()
	def, un, th := names(Scenarios(n)), names(Unannounced(n)), names(Throughput(n))
	seen := map[string]bool{}
	for _, name := range append(append(append([]string(nil), def...), un...), th...) {
		if seen[name] {
			t.Errorf("scenario %q is listed twice", name)
		}
		seen[name] = true
	}
	for _, c := range []struct {
		list string
		want []string
	}{
		{"", def},
		{SetDefault, def},
		{SetUnannounced, un},
		{SetThroughput, th},
		{SetAll, append(append(append([]string(nil), def...), un...), th...)},
		{"saturate, edge-block", []string{"saturate", "edge-block"}},
		{"retry-after,probe-sliding", []string{"retry-after", "probe-sliding"}},
	} {
		scs, err := pick(n, c.list)
		if err != nil {
			t.Fatalf("pick(%q): %v", c.list, err)
		}
		if got := strings.Join(names(scs), ","); got != strings.Join(c.want, ",") {
			t.Errorf("pick(%q) = %s; want %s", c.list, got, strings.Join(c.want, ","))
		}
	}
	if _, err := pick(n, "nope"); err == nil {
		t.Error("pick of an unknown scenario succeeded")
	}
	for _, want := range []string{"edge-block", "understated", "understated-bans", "sublimit"} {
		if !strings.Contains(","+strings.Join(un, ",")+",", ","+want+",") {
			t.Errorf("the %s set lacks %s", SetUnannounced, want)
		}
	}
}

func TestOrderBook(t *testing.T) {
	t.Parallel()
	var o orderBook
	a := o.issue()
	time.Sleep(2 * orderSlack)
	b, c := o.issue(), o.issue()
	o.sent(a)
	o.sent(c) // b was issued together with c: no order to keep
	o.sent(b)
	if o.count() != 0 {
		t.Fatalf("overtaken = %d after requests sent in order or issued together; want 0", o.count())
	}
	d := o.issue()
	time.Sleep(2 * orderSlack)
	e := o.issue()
	o.sent(e) // d waited, issued 2 ms earlier
	o.sent(e) // a retry is no new sending
	o.done(d) // the limiter gave up on d
	if o.count() != 1 || len(o.waiting) != 0 {
		t.Errorf("overtaken = %d, %d waiting; want 1, 0", o.count(), len(o.waiting))
	}

	// The transport reads the number from the rename's body.
	var p orderBook
	first, second := p.issue(), p.issue()
	p.waiting[first] = p.waiting[first].Add(-time.Second)
	tr := &orderTransport{next: roundTripFunc(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody}, nil
	}), book: &p}
	req, _ := http.NewRequest(http.MethodPatch, "http://x/api/v10/channels/1", strings.NewReader(renameBody(second)))
	if _, err := tr.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if data, _ := io.ReadAll(req.Body); string(data) != renameBody(second) {
		t.Errorf("the request's body after the transport = %q; want it untouched", data)
	}
	if p.count() != 1 {
		t.Errorf("overtaken through the transport = %d; want 1", p.count())
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNewScenarios runs hot-retry and mixed end to end with ratecord's
// memory store: both are limited, neither gets an avoidable 429, hot-retry's
// callers are refused rather than made to wait, and mixed's deleted webhook
// is refused once it answered 404.
func TestNewScenarios(t *testing.T) {
	t.Parallel()
	n := discordtest.LANNetwork()
	scs, err := pick(n, "hot-retry,mixed")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Run(t.Context(), scs, []Limiter{Ratecord()}, Options{Duration: 1200 * time.Millisecond, Network: n})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.Successes == 0 || r.MaxPerSecond <= 0 || r.Utilization > 1.0001 {
			t.Errorf("%s: %d successes, max %v/s, utilization %v; want successes within a maximum", r.Scenario, r.Successes, r.MaxPerSecond, r.Utilization)
		}
		if r.Avoidable != 0 || r.Bans != 0 || r.Errors != 0 {
			t.Errorf("%s: %d avoidable 429s, %d bans, %d errors; want none", r.Scenario, r.Avoidable, r.Bans, r.Errors)
		}
		if r.Refused == 0 {
			t.Errorf("%s: no request refused; want the limiter to refuse at once", r.Scenario)
		}
	}
}
