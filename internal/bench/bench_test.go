package bench

import (
	"context"
	"math"
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
	sc, err := pick(Scenarios(), "shared-hash")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := Run(context.Background(), sc, []Limiter{Ratecord()}, Options{Duration: 1200 * time.Millisecond})
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
