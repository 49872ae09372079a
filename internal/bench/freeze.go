package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// freezeGap bounds the pause between two freezes: after a process is
// continued, the next freeze starts after a pause drawn uniformly from
// [0, freezeGap).
const freezeGap = time.Second

// errNoFreeze reports a system without SIGSTOP.
var errNoFreeze = errors.New("stopping a process needs SIGSTOP, which this system lacks")

// FreezeRange is how long a freeze of -freeze lasts: a duration drawn
// uniformly from [Min, Max].
type FreezeRange struct {
	Min, Max time.Duration
}

// ParseFreezeRange parses "MIN-MAX", two durations such as "300ms-1500ms",
// with 0 < MIN <= MAX.
func ParseFreezeRange(s string) (FreezeRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return FreezeRange{}, fmt.Errorf("-freeze %q: want MIN-MAX, two durations such as 300ms-1500ms", s)
	}
	var r FreezeRange
	var err error
	if r.Min, err = time.ParseDuration(strings.TrimSpace(lo)); err != nil {
		return FreezeRange{}, fmt.Errorf("-freeze %q: %w", s, err)
	}
	if r.Max, err = time.ParseDuration(strings.TrimSpace(hi)); err != nil {
		return FreezeRange{}, fmt.Errorf("-freeze %q: %w", s, err)
	}
	switch {
	case r.Min <= 0:
		return FreezeRange{}, fmt.Errorf("-freeze %q: MIN must be positive", s)
	case r.Max < r.Min:
		return FreezeRange{}, fmt.Errorf("-freeze %q: MAX is below MIN", s)
	}
	return r, nil
}

func (r FreezeRange) String() string { return r.Min.String() + "-" + r.Max.String() }

// draw returns a freeze's length, uniform in [Min, Max].
func (r FreezeRange) draw(rng *rand.Rand) time.Duration {
	return r.Min + time.Duration(rng.Int64N(int64(r.Max-r.Min)+1))
}

// Freeze is one stop of a worker process: the process of part Part, with
// id PID, stopped at Start and continued Length later.
type Freeze struct {
	Part   int           `json:"part"`
	PID    int           `json:"pid"`
	Start  time.Time     `json:"start"`
	Length time.Duration `json:"length_ns"`
}

// End is when the process was continued.
func (f Freeze) End() time.Time { return f.Start.Add(f.Length) }

// workerSet holds the worker processes of a scenario run that are running,
// by part, for the freezer to pick from.
type workerSet struct {
	mu    sync.Mutex // guards procs
	procs map[int]*os.Process
}

type workerSetKey struct{}

// withWorkerSet returns ctx carrying set, for [Started].
func withWorkerSet(ctx context.Context, set *workerSet) context.Context {
	return context.WithValue(ctx, workerSetKey{}, set)
}

// Started tells the run whose context ctx is that the worker process of
// part has started, so that -freeze may stop it; it returns the function
// to call once the process has been waited for. An [Options].Spawn that
// starts processes calls it; without a run that freezes it does nothing.
func Started(ctx context.Context, part int, p *os.Process) (done func()) {
	set, ok := ctx.Value(workerSetKey{}).(*workerSet)
	if !ok || set == nil {
		return func() {}
	}
	set.mu.Lock()
	if set.procs == nil {
		set.procs = make(map[int]*os.Process)
	}
	set.procs[part] = p
	set.mu.Unlock()
	return func() {
		set.mu.Lock()
		if set.procs[part] == p {
			delete(set.procs, part)
		}
		set.mu.Unlock()
	}
}

// pick returns a random running process, and false when none runs.
func (s *workerSet) pick(rng *rand.Rand) (int, *os.Process, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.procs) == 0 {
		return 0, nil, false
	}
	parts := make([]int, 0, len(s.procs))
	for p := range s.procs {
		parts = append(parts, p)
	}
	sort.Ints(parts)
	part := parts[rng.IntN(len(parts))]
	return part, s.procs[part], true
}

// freezer stops one process of set at a time: it pauses for a duration
// drawn uniformly from [0, freezeGap), stops a random running process
// (SIGSTOP) for a duration drawn from its range, continues it (SIGCONT),
// and again, as long as its run goes on.
type freezer struct {
	r    FreezeRange
	set  *workerSet
	rng  *rand.Rand
	stop func(*os.Process) error // stops a process; stopProcess unless a test sets it
	cont func(*os.Process) error // continues it; continueProcess unless a test sets it
	// told, when set, is told of each stop (stopped true) and continue,
	// with the worker's part and when it happened: the emulator's judge
	// takes what reached a stopped worker as read when it continued.
	told func(part int, stopped bool, at time.Time)

	mu  sync.Mutex // guards log and err
	log []Freeze
	err error // the first failure to continue a process
}

func newFreezer(r FreezeRange, set *workerSet) *freezer {
	return &freezer{r: r, set: set, rng: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())), stop: stopProcess, cont: continueProcess}
}

// run freezes processes as long as run goes on. A freeze started lasts its
// length, past the end of run, unless hold ends first: the process is then
// continued at once. Every process it stopped is continued before it
// returns.
func (f *freezer) run(run, hold context.Context) {
	for {
		sleep(run, time.Duration(f.rng.Int64N(int64(freezeGap))))
		if run.Err() != nil || hold.Err() != nil {
			return
		}
		part, p, ok := f.set.pick(f.rng)
		if !ok {
			continue
		}
		f.freeze(hold, part, p, f.r.draw(f.rng))
	}
}

// freeze stops p for d, or until ctx ends, and records the freeze. A
// process that is gone (it ended before the signal) is not recorded.
func (f *freezer) freeze(ctx context.Context, part int, p *os.Process, d time.Duration) {
	start := time.Now()
	if err := f.stop(p); err != nil {
		return
	}
	if f.told != nil {
		f.told(part, true, start)
	}
	defer func() {
		err := f.cont(p)
		if f.told != nil {
			f.told(part, false, time.Now())
		}
		if errors.Is(err, os.ErrProcessDone) {
			err = nil
		}
		if err != nil {
			// A process that cannot be continued is not left stopped.
			err = errors.Join(err, p.Kill())
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.log = append(f.log, Freeze{Part: part, PID: p.Pid, Start: start, Length: time.Since(start)})
		if err != nil && f.err == nil {
			f.err = fmt.Errorf("continue worker %d (pid %d): %w", part, p.Pid, err)
		}
	}()
	sleep(ctx, d)
}

// freezes returns the freezes so far and the first failure to continue a
// process.
func (f *freezer) freezes() ([]Freeze, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Freeze(nil), f.log...), f.err
}

// total is the time the freezes lasted together.
func total(fs []Freeze) time.Duration {
	var d time.Duration
	for _, f := range fs {
		d += f.Length
	}
	return d
}
