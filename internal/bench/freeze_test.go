package bench

import (
	"bytes"
	"context"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

func TestParseFreezeRange(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want FreezeRange
	}{
		{"300ms-1500ms", FreezeRange{300 * time.Millisecond, 1500 * time.Millisecond}},
		{"100ms-100ms", FreezeRange{100 * time.Millisecond, 100 * time.Millisecond}},
		{"1s-2.5s", FreezeRange{time.Second, 2500 * time.Millisecond}},
		{" 5ms - 1s ", FreezeRange{5 * time.Millisecond, time.Second}},
	} {
		got, err := ParseFreezeRange(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseFreezeRange(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
	for _, bad := range []string{"", "300ms", "300ms-", "-1s", "1s-300ms", "0s-1s", "abc-1s", "1s-xyz", "1-2"} {
		if got, err := ParseFreezeRange(bad); err == nil {
			t.Errorf("ParseFreezeRange(%q) = %v; want an error", bad, got)
		}
	}
}

func TestFaultFlags(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"-freeze", "300ms-1500ms"}, "-procs 2 or more"},
		{[]string{"-freeze", "300ms-1500ms", "-procs", "1"}, "-procs 2 or more"},
		{[]string{"-freeze", "300ms-1500ms", "-workers", "4"}, "-workers"},
		{[]string{"-freeze", "1500ms-300ms", "-procs", "4"}, "MAX is below MIN"},
		{[]string{"-freeze", "300ms", "-procs", "4"}, "MIN-MAX"},
		{[]string{"-freeze", "0s-1s", "-procs", "4"}, "positive"},
		{[]string{"-redis-restart", "-1s"}, "positive"},
		{[]string{"-redis-restart", "3s", "-redis", "127.0.0.1:1"}, "leave out -redis"},
		{[]string{"-redis-restart", "3s", "-redis-cluster", "127.0.0.1:1"}, "leave out -redis"},
	} {
		err := Main(t.Context(), append(tt.args, "-scenario", "saturate"), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Main(%q) = %v; want an error saying %q", tt.args, err, tt.want)
		}
	}
}

// startSleep starts a process that sleeps for a minute, killed and waited
// for when the test ends.
func startSleep(t *testing.T) *os.Process {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep to run: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd.Process
}

// stopped reports whether the process is stopped, from /proc (Linux).
func stopped(t *testing.T, p *os.Process) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.Pid) + "/stat")
	if err != nil {
		t.Fatalf("state of %d: %v", p.Pid, err)
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && (fields[0] == "T" || fields[0] == "t")
}

func needFreeze(t *testing.T) {
	t.Helper()
	if !canFreeze || runtime.GOOS != "linux" {
		t.Skip("stopping processes and reading their state needs Linux")
	}
}

// TestFreezerStopsOneAtATime runs the freezer over two real processes: it
// stops them (seen in /proc while it runs), one at a time, each freeze
// within the range, and leaves none stopped.
func TestFreezerStopsOneAtATime(t *testing.T) {
	t.Parallel()
	needFreeze(t)
	procs := []*os.Process{startSleep(t), startSleep(t)}
	set := &workerSet{}
	ctx := withWorkerSet(t.Context(), set)
	for i, p := range procs {
		defer Started(ctx, i, p)()
	}
	r := FreezeRange{Min: 20 * time.Millisecond, Max: 60 * time.Millisecond}
	f := newFreezer(r, set)
	run, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(run, t.Context())
	}()
	seen := map[int]bool{}
	for run.Err() == nil {
		for i, p := range procs {
			if stopped(t, p) {
				seen[i] = true
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	<-done
	for i, p := range procs {
		if stopped(t, p) {
			t.Errorf("process %d is still stopped after the freezer returned", i)
		}
	}
	if len(seen) == 0 {
		t.Error("no process was seen stopped")
	}
	fs, err := f.freezes()
	if err != nil {
		t.Fatal(err)
	}
	// About one freeze per 0.5 s pause + 40 ms freeze: 2 s holds 2 or more
	// unless the draws are very unlucky.
	if len(fs) < 2 {
		t.Fatalf("%d freezes in 2s; want at least 2", len(fs))
	}
	const slack = 100 * time.Millisecond // timers fire late on a loaded machine
	for i, z := range fs {
		if z.Length < r.Min || z.Length > r.Max+slack {
			t.Errorf("freeze %d lasted %v; want %v to %v", i, z.Length, r.Min, r.Max)
		}
		if z.Part != 0 && z.Part != 1 || z.PID != procs[z.Part].Pid {
			t.Errorf("freeze %d of part %d pid %d; want one of the two processes", i, z.Part, z.PID)
		}
		if i > 0 && z.Start.Before(fs[i-1].End()) {
			t.Errorf("freeze %d started at %v, before freeze %d ended at %v", i, z.Start, i-1, fs[i-1].End())
		}
	}
	if got := total(fs); got < time.Duration(len(fs))*r.Min {
		t.Errorf("total %v for %d freezes of at least %v", got, len(fs), r.Min)
	}
}

// TestFreezerContinuesOnCancel: a freeze far longer than the run is cut
// short when the hold context ends, and the process runs again.
func TestFreezerContinuesOnCancel(t *testing.T) {
	t.Parallel()
	needFreeze(t)
	p := startSleep(t)
	set := &workerSet{}
	defer Started(withWorkerSet(t.Context(), set), 0, p)()
	f := newFreezer(FreezeRange{Min: time.Minute, Max: time.Minute}, set)
	hold, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f.run(t.Context(), hold)
	}()
	deadline := time.Now().Add(3 * time.Second)
	for !stopped(t, p) {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatal("the process was not stopped within 3s")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the freezer did not return within 5s of its cancellation")
	}
	if stopped(t, p) {
		t.Error("the process is still stopped after the cancellation")
	}
	fs, err := f.freezes()
	if err != nil || len(fs) != 1 || fs[0].Length >= time.Minute {
		t.Errorf("freezes = %v, %v; want one, cut short", fs, err)
	}
}

// TestFreezerSkipsEndedProcess: a process that ended is neither counted
// nor an error, and is no longer picked once its run reports it done.
func TestFreezerSkipsEndedProcess(t *testing.T) {
	t.Parallel()
	needFreeze(t)
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Skipf("no true to run: %v", err)
	}
	set := &workerSet{}
	Started(withWorkerSet(t.Context(), set), 0, cmd.Process)
	f := newFreezer(FreezeRange{Min: time.Millisecond, Max: time.Millisecond}, set)
	f.freeze(t.Context(), 0, cmd.Process, time.Millisecond)
	if fs, err := f.freezes(); len(fs) != 0 || err != nil {
		t.Errorf("freezes of an ended process = %v, %v; want none, no error", fs, err)
	}
}

// TestFreezerPairsSignals checks with fake signals that every stop is
// followed by a continue of the same process before the next stop, and
// that the run only picks processes that are running.
func TestFreezerPairsSignals(t *testing.T) {
	t.Parallel()
	set := &workerSet{}
	ctx := withWorkerSet(t.Context(), set)
	a, b := &os.Process{Pid: 101}, &os.Process{Pid: 102}
	Started(ctx, 0, a)
	doneB := Started(ctx, 1, b)
	doneB() // part 1 ended before the run
	var mu sync.Mutex
	var events []string
	f := newFreezer(FreezeRange{Min: time.Millisecond, Max: 3 * time.Millisecond}, set)
	f.stop = func(p *os.Process) error {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, "stop "+strconv.Itoa(p.Pid))
		return nil
	}
	f.cont = func(p *os.Process) error {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, "cont "+strconv.Itoa(p.Pid))
		return nil
	}
	var told []string
	var last time.Time
	f.told = func(part int, stopped bool, at time.Time) {
		mu.Lock()
		defer mu.Unlock()
		e := "continued " + strconv.Itoa(part)
		if stopped {
			e = "stopped " + strconv.Itoa(part)
		}
		if at.Before(last) {
			e += " out of order"
		}
		last = at
		told = append(told, e)
	}
	run, cancel := context.WithTimeout(t.Context(), 1500*time.Millisecond)
	defer cancel()
	f.run(run, t.Context())
	mu.Lock()
	defer mu.Unlock()
	if len(events) < 2 {
		t.Fatalf("events = %v; want freezes", events)
	}
	alternate(t, "event", events, "stop 101", "cont 101")
	if len(events)%2 != 0 {
		t.Errorf("events end with %q: a stop without its continue", events[len(events)-1])
	}
	fs, _ := f.freezes()
	if len(fs) != len(events)/2 {
		t.Errorf("%d freezes recorded for %d stops", len(fs), len(events)/2)
	}
	// The emulator is told of each stop and continue of the worker, in
	// order, by the worker's part.
	if len(told) != len(events) {
		t.Fatalf("told %v for events %v", told, events)
	}
	alternate(t, "told", told, "stopped 0", "continued 0")
}

// alternate fails t unless got is first, second, first, second and so on.
func alternate(t *testing.T, what string, got []string, first, second string) {
	t.Helper()
	for i, e := range got {
		want := first
		if i%2 == 1 {
			want = second
		}
		if e != want {
			t.Fatalf("%s %d = %q; want %q (%v)", what, i, e, want, got)
		}
	}
}

// TestRunFreezes runs a scenario whose workers are processes that sleep
// (started through Spawn and reported with Started): the result counts
// the freezes, and the table shows them.
func TestRunFreezes(t *testing.T) {
	t.Parallel()
	needFreeze(t)
	sc, err := pick(discordtest.LANNetwork(), "saturate")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	pids := map[int]bool{}
	spawn := func(ctx context.Context, _, _, _, _ string, part, _ int, d time.Duration) (WorkerReport, error) {
		cmd := exec.CommandContext(ctx, "sleep", d.String())
		if err := cmd.Start(); err != nil {
			return WorkerReport{}, err
		}
		mu.Lock()
		pids[cmd.Process.Pid] = true
		mu.Unlock()
		done := Started(ctx, part, cmd.Process)
		defer done()
		return WorkerReport{}, cmd.Wait()
	}
	o := Options{Duration: 2 * time.Second, Procs: 2, Spawn: spawn, Freeze: FreezeRange{Min: 20 * time.Millisecond, Max: 50 * time.Millisecond}}
	rs, err := Run(t.Context(), sc, []Limiter{NoLimiter()}, o)
	if err != nil {
		t.Fatal(err)
	}
	r := rs[0]
	if r.Freeze != "20ms-50ms" || r.Freezes < 1 || r.FrozenSeconds < float64(r.Freezes)*0.02 {
		t.Errorf("result: freeze %q, %d freezes, %.3fs frozen; want 20ms-50ms and at least one freeze of 20ms or more", r.Freeze, r.Freezes, r.FrozenSeconds)
	}
	var out bytes.Buffer
	PrintTable(&out, Aggregate(rs))
	if !strings.Contains(out.String(), "freezes (s)") || !strings.Contains(out.String(), strconv.Itoa(r.Freezes)+" (") {
		t.Errorf("table lacks the freezes:\n%s", out.String())
	}
}

// TestFreezeDraw: freeze lengths are drawn from the whole range and never
// outside it.
func TestFreezeDraw(t *testing.T) {
	t.Parallel()
	r := FreezeRange{Min: 300 * time.Millisecond, Max: 1500 * time.Millisecond}
	f := newFreezer(r, &workerSet{})
	low, high := 0, 0
	for range 10000 {
		d := r.draw(f.rng)
		if d < r.Min || d > r.Max {
			t.Fatalf("drew %v; want %v to %v", d, r.Min, r.Max)
		}
		if d < 600*time.Millisecond {
			low++
		}
		if d > 1200*time.Millisecond {
			high++
		}
	}
	// A quarter of the range each: 2,500 expected.
	if low < 2000 || high < 2000 {
		t.Errorf("%d draws below 600ms and %d above 1200ms of 10000; want about 2500 each", low, high)
	}
	if d := (FreezeRange{Min: time.Second, Max: time.Second}).draw(f.rng); d != time.Second {
		t.Errorf("draw of 1s-1s = %v", d)
	}
}
