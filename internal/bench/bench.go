// Package bench is the load benchmark behind "ratecord bench": scenarios
// that drive rate-limit clients against the discordtest emulator and measure
// what the emulator saw. Clients are pluggable, so peers (no limiter at all,
// discordgo's limiter, go-redis/redis_rate on the same Redis) are measured
// in the same run as ratecord.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// Client sends one request and returns the status, or an error when no
// response came (including a limiter giving up).
type Client interface {
	Do(ctx context.Context, method, url, auth string, body []byte) (int, error)
	Close() error
}

// Limiter makes the clients of one contender. New is called once per
// scenario run and process.
type Limiter struct {
	Name string
	New  func(base http.RoundTripper, cfg ClientConfig) Client
	// Cleanup, if set, is called with the run's id once the run ended, in
	// the process that owns the emulator.
	Cleanup func(run string)
	// Probe, if set, opens a reader of the counters of the server of the
	// limiter's shared store (Redis), read before and after each run; [Run]
	// opens it once and closes it when it returns.
	Probe func(ctx context.Context) (StoreProbe, error)
	// Redis, if set, makes the contender for the Redis of the run (-redis
	// or -redis-cluster), for a peer that keeps its state there: [Main]
	// calls it with that [RedisConfig] and runs the Limiter it returns
	// under Name. Such a limiter is measured as ratecord-redis is when its
	// Probe is [RedisConfig.Probe] and its clients implement
	// [CommandCounter]. Without -redis the contender is left out, as
	// ratecord-redis is. New, Cleanup and Probe of a Limiter with Redis
	// set are not used.
	Redis func(rc RedisConfig) Limiter
}

// ClientConfig is what a scenario run tells the limiter it makes a client
// for.
type ClientConfig struct {
	// Run is the id of the scenario run, the same in every process of the
	// run and different in every run: a shared store keys the run's state
	// with it.
	Run string
	// GlobalLimit is the bot's global limit per second, as Discord raised
	// it for a large bot, or 0 for Discord's default.
	GlobalLimit int
	// Logger, if set, is where the limiter may report what its store did
	// (switches to and from a local limiter): set with -trace-avoidable.
	Logger *slog.Logger
}

// CommandCounter is implemented by clients whose limiter keeps its state in
// a shared store: StoreCommands returns the commands sent to it so far.
type CommandCounter interface {
	StoreCommands() int64
}

// HTTPClient adapts an http.Client (with whatever transport) to Client.
type HTTPClient struct {
	C      *http.Client
	Close_ func() error
}

// Do sends the request and drains the body.
func (h HTTPClient) Do(ctx context.Context, method, url, auth string, body []byte) (int, error) {
	var r io.Reader
	if body != nil {
		r = strings.NewReader(string(body))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, r)
	if err != nil {
		return 0, err
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.C.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// Close releases the client.
func (h HTTPClient) Close() error {
	if h.Close_ != nil {
		return h.Close_()
	}
	return nil
}

// NoLimiter sends requests as they come: the baseline with no rate limiting.
func NoLimiter() Limiter {
	return Limiter{Name: "none", New: func(base http.RoundTripper, _ ClientConfig) Client {
		return HTTPClient{C: &http.Client{Transport: base}}
	}}
}

// Env is what a scenario's load sees.
type Env struct {
	// API is the emulator's base URL, ending in /api/v10.
	API string
	// Client sends requests.
	Client Client
	// Part and Parts number the workers of the run (processes, or with
	// [Options].Workers goroutine groups of one process): this is worker
	// Part of Parts.
	Part, Parts int
	// perWorker, when positive, is the most goroutines a worker runs per
	// load group ([Options].Goroutines); zero splits each group between
	// the processes.
	perWorker int
	rec       *recorder
}

// Goroutines runs goroutines of f until ctx ends: with processes, this
// process's share of n; with workers ([Options].Workers), min(n, G) of them
// for G goroutines per worker, so that the load grows with the workers. The
// index g passed to f is unique across the workers of the run.
func (e *Env) Goroutines(ctx context.Context, n int, f func(ctx context.Context, g int)) {
	var wg sync.WaitGroup
	for _, g := range e.indexes(n) {
		wg.Go(func() {
			for ctx.Err() == nil {
				f(ctx, g)
			}
		})
	}
	wg.Wait()
}

// indexes returns the goroutine indexes this worker runs of a load group
// of n: Part, Part+Parts, ... below n with processes; Part*G to
// Part*G+min(n, G)-1 with workers of G goroutines.
func (e *Env) indexes(n int) []int {
	var gs []int
	if e.perWorker > 0 {
		for j := range min(n, e.perWorker) {
			gs = append(gs, e.Part*e.perWorker+j)
		}
		return gs
	}
	for g := e.Part; g < n; g += max(e.Parts, 1) {
		gs = append(gs, g)
	}
	return gs
}

// Rename sends a rename of channel path ("/channels/{id}"), numbered in the
// order this process issues them, so that the run can tell whether the
// limiter sent a rename while one issued earlier was still waiting (see
// [Result].Overtaken).
func (e *Env) Rename(ctx context.Context, path string) (int, error) {
	n := e.rec.order.issue()
	defer e.rec.order.done(n)
	return send(ctx, e, http.MethodPatch, path, Bot, renameBody(n))
}

// Call records one call of a scenario that counts its calls, and whether
// its caller canceled it in flight (see [Env.CancelAfterSend]).
func (e *Env) Call(canceled bool) {
	e.rec.mu.Lock()
	e.rec.calls++
	if canceled {
		e.rec.canceled++
	}
	e.rec.mu.Unlock()
}

// Overshoot records how long after its deadline a request returned.
func (e *Env) Overshoot(d time.Duration) { e.rec.add(d) }

// Interactive records how long an interactive request took, from its send
// to its response.
func (e *Env) Interactive(d time.Duration) {
	e.rec.mu.Lock()
	e.rec.waits = append(e.rec.waits, d)
	e.rec.mu.Unlock()
}

// Scenario is one workload with the emulator configuration it runs against.
type Scenario struct {
	Name string
	// GlobalLimit is the bot's global limit per second when Discord raised
	// it (a large bot): the emulator enforces it and the limiters are told
	// it. 0 is Discord's default, 50.
	GlobalLimit int
	// Emulator configures the emulator.
	Emulator []discordtest.Option
	// Load drives requests until ctx ends.
	Load func(ctx context.Context, env *Env)
	// Control, if set, runs beside the load in the process that owns the
	// emulator (live changes).
	Control func(ctx context.Context, srv *discordtest.Server, d time.Duration)
	// Max is the most successful requests the emulator's limits allow
	// between first, when the first counted success arrived at the
	// emulator, and end, the end of the run, both measured from the start
	// of the run. Measuring from the first arrival rather than the start
	// keeps the network's first way up and the limiter's first round trip
	// out of the figure: a window at Discord opens when a request arrives.
	Max func(first, end time.Duration) float64
	// Counted selects the successes compared with Max (nil: all).
	Counted func(e discordtest.LogEntry) bool
	// Late, if set, returns for the counted successes how late each one that
	// waited for a slot arrived after the slot opened.
	Late func(log []discordtest.LogEntry) []time.Duration
	// RetryLate, if set, replaces Late: it is given every request of the
	// run's log, whatever its status, and returns how late each request
	// that waited for a 429's wait arrived after the wait ran out.
	RetryLate func(log []discordtest.LogEntry) []time.Duration
	// LateNote, if set, says what the late columns measure when it is not
	// how late a request arrived after its slot opened; the table's footer
	// prints it.
	LateNote string
	// Deadline, if positive, is the deadline every request of the
	// scenario carries; the table reports how late they returned.
	Deadline time.Duration
	// WaitNote, if set, says which requests the scenario records with
	// [Env.Interactive] when they are not urgent replies; the table's
	// footer prints it.
	WaitNote string
	// Renames reports that the load renames channels with [Env.Rename]:
	// the table's footer then says how many renames overtook earlier ones.
	Renames bool
	// FixedLoad reports that the scenario's load groups keep their size
	// whatever the number of workers: with -workers they are split across
	// the workers, as across processes, rather than run up to
	// -goroutines goroutines in every worker. A scenario whose emulator
	// bans after a number of requests into a block sets it: more callers
	// would have more requests in flight when a block starts than any
	// client could keep from it.
	FixedLoad bool
	// MinDuration, if positive, is how long the scenario runs at least,
	// whatever [Options].Duration says: a scenario whose first limit
	// pauses the client for seconds needs longer to show what follows.
	MinDuration time.Duration
}

// Result is what one run of a scenario with a limiter measured.
type Result struct {
	Scenario string `json:"scenario"`
	Limiter  string `json:"limiter"`
	// Run numbers the runs of one scenario and limiter from 1.
	Run     int    `json:"run,omitempty"`
	Latency string `json:"latency,omitempty"`
	Procs   int    `json:"procs"`
	// Workers, with [Options].Workers, is how many workers ran in one
	// process, each with its own client, running at most Goroutines
	// goroutines per load group; Procs is then 1.
	Workers    int `json:"workers,omitempty"`
	Goroutines int `json:"goroutines_per_group,omitempty"`
	// Seconds is the span measured: from the first counted success's
	// arrival (Warmup seconds into the run) to the end of the run.
	Seconds      float64 `json:"seconds"`
	Warmup       float64 `json:"warmup_seconds"`
	Requests     int     `json:"requests"`
	Successes    int     `json:"successes"`
	PerSecond    float64 `json:"ok_per_second"`
	MaxPerSecond float64 `json:"max_per_second"`
	Utilization  float64 `json:"utilization"`
	Avoidable    int     `json:"avoidable_429"`
	Unavoidable  int     `json:"unavoidable_429"`
	User         int     `json:"429_user"`
	Global       int     `json:"429_global"`
	Shared       int     `json:"429_shared"`
	// Edge counts the header-less 429s of Discord's edge (a blocked IP).
	Edge int `json:"429_edge"`
	// Bare counts the 429s that carried only Retry-After: no rate-limit
	// headers, no scope, no body.
	Bare int `json:"429_bare,omitempty"`
	// Lost counts the responses the emulator wrote to no one: their caller
	// had given up while they were on their way down.
	Lost int `json:"responses_lost,omitempty"`
	// Calls counts the calls of a scenario that records them, and Canceled
	// how many of those its caller canceled after the request left and
	// before the response came.
	Calls        int     `json:"calls,omitempty"`
	Canceled     int     `json:"canceled_in_flight,omitempty"`
	Unauthorized int     `json:"401"`
	Bans         int     `json:"bans"`
	Banned       int     `json:"banned_responses"`
	LateP50      float64 `json:"late_p50_ms"`
	LateP99      float64 `json:"late_p99_ms"`
	LateN        int     `json:"late_samples"`
	OverP50      float64 `json:"deadline_overshoot_p50_ms,omitempty"`
	OverP99      float64 `json:"deadline_overshoot_p99_ms,omitempty"`
	OverMax      float64 `json:"deadline_overshoot_max_ms,omitempty"`
	OverN        int     `json:"deadline_requests,omitempty"`
	// Overtaken counts the renames (sent with [Env.Rename]) that a limiter
	// sent to the emulator while a rename its process had issued at least a
	// millisecond earlier had not been sent yet.
	Overtaken int `json:"renames_overtaken,omitempty"`
	// WaitP50 and WaitP99 are the percentiles of how long interactive
	// requests took (scenarios with interactive traffic; WaitN samples).
	WaitP50 float64 `json:"interactive_wait_p50_ms,omitempty"`
	WaitP99 float64 `json:"interactive_wait_p99_ms,omitempty"`
	WaitN   int     `json:"interactive_requests,omitempty"`
	Errors  int     `json:"client_errors"`
	// Refused counts the requests the limiter refused at once for a reason
	// the scenario expects (a caller that will not wait, a webhook known to
	// be gone); they are not in Errors.
	Refused int `json:"refused,omitempty"`
	// All2xx counts every 2xx the emulator answered in the run, counted or
	// not: the figures per 2xx below divide by it.
	All2xx int `json:"all_2xx"`
	// StoreCommands counts the commands every worker sent to a shared
	// store (Redis), from the go-redis hook of each client, and
	// StorePerRequest divides them by Requests; both are zero for limiters
	// without one.
	StoreCommands   int64   `json:"redis_commands,omitempty"`
	StorePerRequest float64 `json:"redis_commands_per_request,omitempty"`
	// StoreExecuted counts the commands the store's server executed during
	// the run, from INFO commandstats: the commands Lua scripts run
	// included, the measurement's own INFO not.
	StoreExecuted int64 `json:"redis_commands_executed,omitempty"`
	// StoreCPU is the CPU time the shared store's server used during the
	// run (user and system, every thread of the server; a cluster's
	// masters added up), and StoreCPUPerRequest that time in microseconds
	// divided by Requests. StoreIdleCPU is the share of StoreCPU an idle
	// server would have used (StoreIdleRate, in ms per second, times
	// StoreSeconds, the time between the readings before and after the
	// run); the figures below count StoreCPU less StoreIdleCPU.
	StoreCPU           time.Duration `json:"redis_cpu_ns,omitempty"`
	StoreCPUPerRequest float64       `json:"redis_cpu_us_per_request,omitempty"`
	StoreIdleCPU       time.Duration `json:"redis_idle_cpu_ns,omitempty"`
	StoreIdleRate      float64       `json:"redis_idle_cpu_ms_per_s,omitempty"`
	StoreSeconds       float64       `json:"redis_span_seconds,omitempty"`
	// StoreSentPer2xx and StoreExecPer2xx are the commands sent and
	// executed per 2xx; StoreCPUPer2xx is the load's CPU time in
	// microseconds per 2xx, StoreCPUPerSecond in milliseconds per second of
	// the run, and Store2xxPerCore the 2xx per second one Redis core
	// would carry: 2xx per second divided by CPU seconds per second.
	StoreSentPer2xx   float64 `json:"redis_commands_sent_per_2xx,omitempty"`
	StoreExecPer2xx   float64 `json:"redis_commands_executed_per_2xx,omitempty"`
	StoreCPUPer2xx    float64 `json:"redis_cpu_us_per_2xx,omitempty"`
	StoreCPUPerSecond float64 `json:"redis_cpu_ms_per_s,omitempty"`
	Store2xxPerCore   float64 `json:"redis_2xx_per_s_per_core,omitempty"`
	// DeadlineMS is the deadline of the scenario's requests, if any.
	DeadlineMS float64 `json:"deadline_ms,omitempty"`
	// Freeze is the range of the run's freezes of worker processes
	// (-freeze), "" without; Freezes counts the freezes and FrozenSeconds
	// adds up their lengths. InFlight counts the requests a freeze caught
	// in flight: handed to the network before their process stopped,
	// written after it continued (the emulator's Stats.Frozen), whose 429s
	// it judged unavoidable.
	Freeze        string  `json:"freeze,omitempty"`
	Freezes       int     `json:"freezes,omitempty"`
	FrozenSeconds float64 `json:"frozen_seconds,omitempty"`
	InFlight      int     `json:"frozen_in_flight,omitempty"`
	// RedisOutage is how long, in seconds, the run's Redis was down before
	// it was restarted (-redis-restart), 0 without; RedisRestarts counts
	// the restarts.
	RedisOutage   float64 `json:"redis_outage_seconds,omitempty"`
	RedisRestarts int     `json:"redis_restarts,omitempty"`

	late, over, waits []time.Duration // the samples behind the percentiles
}

// Options of a run.
type Options struct {
	Duration time.Duration
	Procs    int
	// Workers, if positive, runs the load as that many workers in this
	// process instead of Procs processes: each worker gets its own client
	// from the limiter (for ratecord-redis its own Redis client and
	// connection pool, store and ratecord transport) and its own HTTP
	// transport, as a process would, and runs at most Goroutines (at least
	// 1) goroutines of every load group, so that the load grows with the
	// workers (but see Scenario.FixedLoad).
	Workers    int
	Goroutines int
	// Network is the latency between clients and the emulator, named
	// Latency in the results; the zero Network has none.
	Network discordtest.Network
	Latency string
	// Repeat is how many times each scenario runs with each limiter; zero
	// or less runs once.
	Repeat int
	// Spawn starts a worker process for part of the load of the scenario
	// run with id run and returns its report; nil runs everything in this
	// process.
	Spawn func(ctx context.Context, run, scenario, limiter, url string, part, parts int, d time.Duration) (WorkerReport, error)
	// Progress receives a line per run; may be nil.
	Progress io.Writer
	// Freeze, if its Max is positive, has a freezer stop one worker
	// process at a time for the whole of each run (-freeze): it pauses for
	// a duration drawn uniformly from [0, 1 s), stops a random running
	// worker (SIGSTOP) for a duration drawn uniformly from the range,
	// continues it (SIGCONT), and again. Only processes that Spawn
	// reports with [Started] are stopped.
	Freeze FreezeRange
	// Outage, if set, kills the run's Redis a third of the way into each
	// run and starts it again, empty, Outage.Down later (-redis-restart);
	// each run lasts long enough for the server to be back 5 s before its
	// end (see [RedisOutage]).
	Outage *RedisOutage
	// Trace, if set, receives for each run a line of its faults and a line
	// per avoidable 429 with the attempt it was (-trace-avoidable); the
	// workers then record every attempt.
	Trace io.Writer
}

// runLength is how long a run of sc lasts.
func (o Options) runLength(sc Scenario) time.Duration {
	return o.Outage.runLength(max(o.Duration, sc.MinDuration))
}

// Run measures every limiter on every scenario, o.Repeat times each, and
// returns a result per run; [Aggregate] makes rows of them.
func Run(ctx context.Context, scenarios []Scenario, limiters []Limiter, o Options) ([]Result, error) {
	var out []Result
	repeat := max(o.Repeat, 1)
	probes := map[string]*probed{}
	defer func() {
		for _, p := range probes {
			p.probe.Close()
		}
	}()
	for _, lim := range limiters {
		if p := openProbe(ctx, lim, o.Progress); p != nil {
			probes[lim.Name] = p
		}
	}
	for _, sc := range scenarios {
		for _, lim := range limiters {
			for i := 1; i <= repeat; i++ {
				if o.Progress != nil {
					fmt.Fprintf(o.Progress, "bench: %-16s %-14s run %d/%d, %s, %v ...", sc.Name, lim.Name, i, repeat, o.describeLoad(), o.runLength(sc))
				}
				start := time.Now()
				r, err := runOne(ctx, sc, lim, o, probes[lim.Name], i)
				if err != nil {
					return out, fmt.Errorf("%s/%s run %d: %w", sc.Name, lim.Name, i, err)
				}
				if o.Progress != nil {
					faults := ""
					if r.Freeze != "" {
						faults += fmt.Sprintf(", %d freezes (%.1fs, %d requests caught in flight)", r.Freezes, r.FrozenSeconds, r.InFlight)
					}
					if r.RedisOutage > 0 {
						faults += fmt.Sprintf(", %d Redis restarts", r.RedisRestarts)
					}
					fmt.Fprintf(o.Progress, " %.0f ok/s, utilization %.3f, %d avoidable 429s%s (%.1fs)\n", r.PerSecond, r.Utilization, r.Avoidable, faults, time.Since(start).Seconds())
				}
				out = append(out, r)
				if ctx.Err() != nil {
					return out, ctx.Err()
				}
			}
		}
	}
	return out, nil
}

// describeLoad says how the load is run, for the progress lines.
func (o Options) describeLoad() string {
	if o.Workers > 0 {
		return fmt.Sprintf("%d workers of ≤%d goroutines", o.Workers, max(o.Goroutines, 1))
	}
	return fmt.Sprintf("%d proc(s)", max(o.Procs, 1))
}

// probed is an open probe of a limiter's store and the server's idle rate,
// its CPU time per second of wall time with no load.
type probed struct {
	probe StoreProbe
	idle  time.Duration
}

// openProbe opens lim's probe, if it has one, and measures the server's
// idle rate over idleSpan. It returns nil when lim has no probe or the
// server cannot be read, saying why on progress: the run's store figures
// are then left out.
func openProbe(ctx context.Context, lim Limiter, progress io.Writer) *probed {
	if lim.Probe == nil {
		return nil
	}
	fail := func(err error) *probed {
		if progress != nil {
			fmt.Fprintf(progress, "bench: %s: no Redis figures: %v\n", lim.Name, err)
		}
		return nil
	}
	p, err := lim.Probe(ctx)
	if err != nil {
		return fail(err)
	}
	a, err := p.Read(ctx)
	t0 := time.Now()
	if err == nil {
		sleep(ctx, idleSpan)
	}
	b, err2 := p.Read(ctx)
	if err = errors.Join(err, err2, ctx.Err()); err != nil {
		p.Close()
		return fail(err)
	}
	idle := idleRate(a, b, time.Since(t0))
	if progress != nil {
		fmt.Fprintf(progress, "bench: %s: Redis idle CPU %.3f ms/s over %.1fs\n", lim.Name, float64(idle)/float64(time.Millisecond), idleSpan.Seconds())
	}
	return &probed{probe: p, idle: idle}
}

// runOne runs scenario sc with limiter lim once, as run i of them.
func runOne(ctx context.Context, sc Scenario, lim Limiter, o Options, probe *probed, i int) (Result, error) {
	o.Duration = o.runLength(sc)
	opts := append([]discordtest.Option{discordtest.WithLogLimit(2_000_000)}, sc.Emulator...)
	opts = append(opts, discordtest.WithNetwork(o.Network))
	if sc.GlobalLimit > 0 {
		opts = append(opts, discordtest.WithGlobalLimit(sc.GlobalLimit))
	}
	srv, err := discordtest.Start(opts...)
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()
	// The server's counters are read before the run's clock starts and
	// after every worker closed its client.
	var before StoreStats
	var readAt time.Time
	if probe != nil {
		var err error
		if before, err = probe.probe.Read(ctx); err != nil {
			probe = nil
		}
		readAt = time.Now()
	}
	procs := max(o.Procs, 1)
	runCtx, cancel := runContext(ctx, o.Duration)
	defer cancel()
	start := time.Now()
	run := runID(sc.Name, lim.Name)
	if lim.Cleanup != nil {
		defer lim.Cleanup(run)
	}

	rec := &recorder{}
	var wg sync.WaitGroup
	var spawnErr error
	var mu sync.Mutex
	if o.Trace != nil {
		ctx, runCtx = withTrace(ctx), withTrace(runCtx)
	}
	set := &workerSet{}
	var frz *freezer
	if o.Freeze.Max > 0 {
		// The freezer starts freezes until the run ends; every process it
		// stopped is continued before wg.Wait returns.
		frz = newFreezer(o.Freeze, set)
		frz.told = func(part int, stopped bool, at time.Time) {
			// Workers name themselves by their part (see processTransport).
			if stopped {
				srv.Stopped(strconv.Itoa(part), at)
			} else {
				srv.Continued(strconv.Itoa(part), at)
			}
		}
		wg.Go(func() { frz.run(runCtx, ctx) })
	}
	var outage outageRecord
	var outageErr error
	if o.Outage != nil {
		wg.Go(func() { outage, outageErr = o.Outage.cause(ctx, runCtx, start, o.Duration) })
	}
	if sc.Control != nil {
		wg.Add(1)
		go func() { defer wg.Done(); sc.Control(runCtx, srv, o.Duration) }()
	}
	switch {
	case o.Workers > 0:
		procs = 1
		for w := range o.Workers {
			wg.Go(func() {
				own := &recorder{}
				runLoad(runCtx, run, sc, lim, srv.URL(), w, o.Workers, max(o.Goroutines, 1), own)
				rec.merge(own.report())
			})
		}
	case procs == 1 || o.Spawn == nil:
		RunLoad(runCtx, run, sc, lim, srv.URL(), 0, 1, rec)
	default:
		for p := 0; p < procs; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep, err := o.Spawn(withWorkerSet(ctx, set), run, sc.Name, lim.Name, srv.URL(), p, procs, o.Duration)
				mu.Lock()
				defer mu.Unlock()
				if err != nil && spawnErr == nil {
					spawnErr = err
				}
				rec.merge(rep)
			}()
		}
	}
	wg.Wait()
	var freezes []Freeze
	var freezeErr error
	if frz != nil {
		freezes, freezeErr = frz.freezes()
	}
	if err := errors.Join(spawnErr, freezeErr, outageErr); err != nil {
		return Result{}, err
	}
	var after StoreStats
	var span time.Duration
	if probe != nil {
		var err error
		after, err = probe.probe.Read(ctx)
		span = time.Since(readAt)
		if err != nil {
			probe = nil
		}
	}
	st := srv.Stats()
	r := summarize(sc, lim.Name, procs, start, o.Duration, st, rec)
	r.Latency, r.Run = o.Latency, i
	if o.Workers > 0 {
		r.Workers, r.Goroutines = o.Workers, max(o.Goroutines, 1)
	}
	if probe != nil {
		if cpu, idle, calls, ok := storeDelta(before, after, span, probe.idle); ok {
			r.StoreCPU, r.StoreIdleCPU, r.StoreExecuted, r.StoreSeconds = cpu, idle, calls, span.Seconds()
			r.StoreIdleRate = float64(probe.idle) / float64(time.Millisecond)
			if st.Requests > 0 {
				r.StoreCPUPerRequest = float64(r.StoreCPU) / float64(time.Microsecond) / float64(st.Requests)
			}
		}
	}
	r.storeCost()
	if o.Freeze.Max > 0 {
		r.Freeze, r.Freezes, r.FrozenSeconds = o.Freeze.String(), len(freezes), total(freezes).Seconds()
	}
	if o.Outage != nil {
		r.RedisOutage, r.RedisRestarts = o.Outage.Down.Seconds(), outage.Restarts
	}
	if o.Trace != nil {
		rec.mu.Lock()
		tr := traced{attempts: rec.attempts, errKinds: maps.Clone(rec.errKinds), events: rec.events, freezes: freezes, outage: outage}
		rec.mu.Unlock()
		if err := writeTrace(o.Trace, r, start, st.Log, tr); err != nil {
			return Result{}, fmt.Errorf("trace: %w", err)
		}
	}
	return r, nil
}

// runContext returns a context canceled after d. It has no deadline: the
// end of a run is not a deadline of the requests in flight, and a limiter
// must not fail them early because their wait outlasts the run.
func runContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	t := time.AfterFunc(d, cancel)
	return ctx, func() {
		t.Stop()
		cancel()
	}
}

// runID returns an id unique to one run of limiter on scenario.
func runID(scenario, limiter string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s:%s:%d:%s", scenario, limiter, time.Now().UnixNano(), hex.EncodeToString(b[:]))
}

// RunLoad runs one process's share of the load of scenario run run against
// the emulator at url until ctx ends, recording deadline overshoots and
// store commands in rec (which may be nil).
func RunLoad(ctx context.Context, run string, sc Scenario, lim Limiter, url string, part, parts int, rec *recorder) {
	runLoad(ctx, run, sc, lim, url, part, parts, 0, rec)
}

// perWorker returns how many goroutines a worker of workers of g
// goroutines runs per load group of the scenario: g, or 0 (split across
// the workers as across processes) for a FixedLoad.
func (sc Scenario) perWorker(g int) int {
	if sc.FixedLoad {
		return 0
	}
	return g
}

// runLoad runs the load of worker part of parts, a process (perWorker 0)
// or a goroutine group of at most perWorker goroutines per load group, with
// a client and an HTTP transport of its own. Every request it sends carries
// its number in processHeader.
func runLoad(ctx context.Context, run string, sc Scenario, lim Limiter, url string, part, parts, perWorker int, rec *recorder) {
	if rec == nil {
		rec = &recorder{}
	}
	tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	pt := &processTransport{next: tr, worker: strconv.Itoa(part), part: part}
	cfg := ClientConfig{Run: run, GlobalLimit: sc.GlobalLimit}
	if tracing(ctx) {
		pt.trace = rec
		rec.mu.Lock()
		rec.tracing = true
		rec.mu.Unlock()
		cfg.Logger = slog.New(&eventHandler{rec: rec, part: part})
	}
	base := &orderTransport{next: pt, book: &rec.order}
	c := lim.New(base, cfg)
	env := &Env{API: url + apiPrefix, Client: c, Part: part, Parts: parts, perWorker: sc.perWorker(perWorker), rec: rec}
	sc.Load(ctx, env)
	// Closed before the commands are counted: what closing sends is in
	// the count, as it is in the server's.
	c.Close()
	if cc, ok := c.(CommandCounter); ok {
		rec.mu.Lock()
		rec.commands += cc.StoreCommands()
		rec.counted = true
		rec.mu.Unlock()
	}
}

// apiPrefix starts the path of every request to the emulator.
const apiPrefix = "/api/v10"

// WorkerReport is what a worker process tells the process that owns the
// emulator, as JSON on its standard output.
type WorkerReport struct {
	// Overshoots are how long after their deadlines requests returned.
	Overshoots []time.Duration `json:"overshoots"`
	// Waits are how long interactive requests took.
	Waits []time.Duration `json:"waits,omitempty"`
	// StoreCommands counts the commands sent to a shared store; Counted
	// reports whether the limiter has one.
	StoreCommands int64 `json:"store_commands"`
	Counted       bool  `json:"counted"`
	// Errors counts requests that got no response; Refused those the
	// limiter refused as the scenario expects.
	Errors  int `json:"errors"`
	Refused int `json:"refused,omitempty"`
	// Calls and Canceled count the calls the scenario recorded and those
	// canceled in flight ([Env.Call]).
	Calls    int `json:"calls,omitempty"`
	Canceled int `json:"canceled,omitempty"`
	// Overtaken counts renames sent while an earlier one waited.
	Overtaken int `json:"renames_overtaken,omitempty"`
	// Attempts, with -trace-avoidable, are every request the worker sent,
	// and ErrorKinds its errors by kind.
	Attempts   []Attempt      `json:"attempts,omitempty"`
	ErrorKinds map[string]int `json:"error_kinds,omitempty"`
	// Events, with -trace-avoidable, are what the worker's store reported.
	Events []StoreEvent `json:"store_events,omitempty"`
}

// RunWorker is the body of a worker process: it runs its part of the
// scenario run run and writes its [WorkerReport] to w as JSON.
func RunWorker(ctx context.Context, run string, sc Scenario, lim Limiter, url string, part, parts int, d time.Duration, w io.Writer) error {
	ctx, cancel := runContext(ctx, d)
	defer cancel()
	rec := &recorder{}
	RunLoad(ctx, run, sc, lim, url, part, parts, rec)
	return json.NewEncoder(w).Encode(rec.report())
}

func summarize(sc Scenario, limiter string, procs int, start time.Time, d time.Duration, st discordtest.Stats, rec *recorder) Result {
	r := Result{LateP50: math.NaN(), LateP99: math.NaN(), Scenario: sc.Name, Limiter: limiter, Procs: procs,
		Requests: st.Requests, Avoidable: st.Avoidable, Unavoidable: st.Unavoidable, User: st.ByScope["user"],
		Global: st.ByScope["global"], Shared: st.ByScope["shared"], Edge: st.EdgeBlocks, Bare: st.Bare, Lost: st.Lost,
		InFlight:     st.Frozen,
		Unauthorized: st.ByStatus[401], Bans: st.Bans,
		Banned: st.BannedResponses, All2xx: all2xx(st.ByStatus)}
	end := start.Add(d)
	var counted []discordtest.LogEntry
	for _, e := range st.Log {
		if e.Status < 200 || e.Status > 299 || e.Time.After(end) {
			continue
		}
		if sc.Counted == nil || sc.Counted(e) {
			counted = append(counted, e)
		}
	}
	// Measure from the first counted arrival: before it, the network and
	// the limiter's first round trip leave nothing to use.
	var first time.Duration
	for i, e := range counted {
		if off := max(e.Time.Sub(start), 0); i == 0 || off < first {
			first = off
		}
	}
	measured := d - first
	r.Seconds, r.Warmup = measured.Seconds(), first.Seconds()
	r.Successes = len(counted)
	r.PerSecond = float64(r.Successes) / measured.Seconds()
	if sc.Max != nil {
		m := sc.Max(first, d)
		r.MaxPerSecond = m / measured.Seconds()
		if m > 0 {
			r.Utilization = float64(r.Successes) / m
		}
	}
	switch {
	case sc.RetryLate != nil:
		var log []discordtest.LogEntry
		for _, e := range st.Log {
			if !e.Time.After(end) {
				log = append(log, e)
			}
		}
		r.late = sc.RetryLate(log)
		r.LateN = len(r.late)
		r.LateP50, r.LateP99 = percentileMS(r.late, 0.50), percentileMS(r.late, 0.99)
	case sc.Late != nil:
		r.late = sc.Late(counted)
		r.LateN = len(r.late)
		r.LateP50, r.LateP99 = percentileMS(r.late, 0.50), percentileMS(r.late, 0.99)
	}
	if sc.Deadline > 0 {
		r.DeadlineMS = float64(sc.Deadline) / float64(time.Millisecond)
		r.over = rec.all()
		r.OverN = len(r.over)
		r.OverP50, r.OverP99, r.OverMax = percentileMS(r.over, 0.50), percentileMS(r.over, 0.99), percentileMS(r.over, 1)
	}
	rec.mu.Lock()
	r.waits = append([]time.Duration(nil), rec.waits...)
	rec.mu.Unlock()
	if r.WaitN = len(r.waits); r.WaitN > 0 {
		r.WaitP50, r.WaitP99 = percentileMS(r.waits, 0.50), percentileMS(r.waits, 0.99)
	}
	r.Errors, r.Refused = rec.errors, rec.refused
	r.Calls, r.Canceled = rec.calls, rec.canceled
	r.Overtaken = rec.order.count() + rec.overtaken
	if rec.counted {
		r.StoreCommands = rec.commands
		if st.Requests > 0 {
			r.StorePerRequest = float64(rec.commands) / float64(st.Requests)
		}
	}
	return r
}

// all2xx adds up the 2xx answers of a count by status: every answer the
// emulator gave, as its log would list them, but not bounded by the log's
// length.
func all2xx(byStatus map[int]int) int {
	n := 0
	for status, c := range byStatus {
		if status >= 200 && status <= 299 {
			n += c
		}
	}
	return n
}

type recorder struct {
	mu       sync.Mutex // guards every field below
	over     []time.Duration
	waits    []time.Duration
	errors   int
	refused  int
	calls    int
	canceled int
	commands int64
	counted  bool
	// overtaken adds up the overtaken renames of worker processes; order
	// follows this process's own.
	overtaken int
	order     orderBook
	// attempts, with -trace-avoidable, are the requests sent, and
	// errKinds the errors by kind ([errorKind]).
	attempts []Attempt
	errKinds map[string]int
	events   []StoreEvent
	tracing  bool
}

// merge adds a worker's report.
func (r *recorder) merge(rep WorkerReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = append(r.over, rep.Overshoots...)
	r.waits = append(r.waits, rep.Waits...)
	r.errors += rep.Errors
	r.refused += rep.Refused
	r.calls += rep.Calls
	r.canceled += rep.Canceled
	r.overtaken += rep.Overtaken
	r.attempts = append(r.attempts, rep.Attempts...)
	r.addErrors(rep.ErrorKinds)
	r.events = append(r.events, rep.Events...)
	r.commands += rep.StoreCommands
	r.counted = r.counted || rep.Counted
}

// report is what a worker tells the process that owns the emulator.
func (r *recorder) report() WorkerReport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return WorkerReport{Overshoots: append([]time.Duration(nil), r.over...), Waits: append([]time.Duration(nil), r.waits...),
		StoreCommands: r.commands, Counted: r.counted, Errors: r.errors, Refused: r.refused, Calls: r.calls, Canceled: r.canceled,
		Overtaken: r.order.count() + r.overtaken, Attempts: append([]Attempt(nil), r.attempts...),
		ErrorKinds: maps.Clone(r.errKinds), Events: append([]StoreEvent(nil), r.events...)}
}

func (r *recorder) add(d time.Duration) {
	r.mu.Lock()
	r.over = append(r.over, d)
	r.mu.Unlock()
}

func (r *recorder) all() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.over...)
}

func percentileMS(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return math.NaN()
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := int(math.Ceil(p*float64(len(s)))) - 1
	i = min(max(i, 0), len(s)-1)
	return float64(s[i]) / float64(time.Millisecond)
}

// Row is one line of the table: a scenario and limiter over one or more
// runs. Its Result holds the figures of all runs together: counts summed,
// rates and utilization averaged, lateness and deadline percentiles over
// the samples of every run.
type Row struct {
	Result
	// Runs is the number of runs; AvoidableRuns how many of them had an
	// avoidable 429, FailedRuns how many miss a goal of [Check].
	Runs          int `json:"runs"`
	AvoidableRuns int `json:"runs_with_avoidable_429"`
	FailedRuns    int `json:"runs_failing_check"`
	// MinUtilization is the lowest utilization of a run.
	MinUtilization float64 `json:"min_utilization"`
	// PerRun holds each run's figures.
	PerRun []Result `json:"per_run"`
}

// Aggregate makes a row of the runs of each scenario and limiter, in the
// order they first appear in rs.
func Aggregate(rs []Result) []Row {
	var rows []Row
	index := map[[2]string]int{}
	for _, r := range rs {
		k := [2]string{r.Scenario, r.Limiter}
		i, ok := index[k]
		if !ok {
			i = len(rows)
			index[k] = i
			rows = append(rows, Row{})
		}
		rows[i].PerRun = append(rows[i].PerRun, r)
	}
	for i := range rows {
		rows[i].aggregate()
	}
	return rows
}

// aggregate computes the row's figures from PerRun.
func (w *Row) aggregate() {
	runs := w.PerRun
	n := float64(len(runs))
	a := Result{Scenario: runs[0].Scenario, Limiter: runs[0].Limiter, Latency: runs[0].Latency, Procs: runs[0].Procs,
		Workers: runs[0].Workers, Goroutines: runs[0].Goroutines, DeadlineMS: runs[0].DeadlineMS, StoreIdleRate: runs[0].StoreIdleRate,
		Freeze: runs[0].Freeze, RedisOutage: runs[0].RedisOutage}
	w.Runs, w.MinUtilization = len(runs), math.Inf(1)
	for _, r := range runs {
		a.Seconds += r.Seconds
		a.Warmup += r.Warmup / n
		a.Requests += r.Requests
		a.Successes += r.Successes
		a.PerSecond += r.PerSecond / n
		a.MaxPerSecond += r.MaxPerSecond / n
		a.Utilization += r.Utilization / n
		a.Avoidable += r.Avoidable
		a.Unavoidable += r.Unavoidable
		a.User += r.User
		a.Global += r.Global
		a.Shared += r.Shared
		a.Edge += r.Edge
		a.Bare += r.Bare
		a.Lost += r.Lost
		a.Calls += r.Calls
		a.Canceled += r.Canceled
		a.Unauthorized += r.Unauthorized
		a.Bans += r.Bans
		a.Banned += r.Banned
		a.Errors += r.Errors
		a.Refused += r.Refused
		a.Overtaken += r.Overtaken
		a.All2xx += r.All2xx
		a.StoreCommands += r.StoreCommands
		a.StoreExecuted += r.StoreExecuted
		a.StoreCPU += r.StoreCPU
		a.StoreIdleCPU += r.StoreIdleCPU
		a.StoreSeconds += r.StoreSeconds
		a.Freezes += r.Freezes
		a.FrozenSeconds += r.FrozenSeconds
		a.InFlight += r.InFlight
		a.RedisRestarts += r.RedisRestarts
		a.late = append(a.late, r.late...)
		a.over = append(a.over, r.over...)
		a.waits = append(a.waits, r.waits...)
		a.WaitN += r.WaitN
		a.LateN += r.LateN
		a.OverN += r.OverN
		w.MinUtilization = min(w.MinUtilization, r.Utilization)
		if r.Avoidable > 0 {
			w.AvoidableRuns++
		}
		if checkRun(r) != nil {
			w.FailedRuns++
		}
	}
	if a.Requests > 0 && a.StoreCommands > 0 {
		a.StorePerRequest = float64(a.StoreCommands) / float64(a.Requests)
	}
	if a.Requests > 0 && a.StoreCPU > 0 {
		a.StoreCPUPerRequest = float64(a.StoreCPU) / float64(time.Microsecond) / float64(a.Requests)
	}
	a.storeCost()
	a.LateP50, a.LateP99 = pooled(runs, a.late, func(r Result) float64 { return r.LateP50 }, 0.50), pooled(runs, a.late, func(r Result) float64 { return r.LateP99 }, 0.99)
	a.OverP50, a.OverP99 = pooled(runs, a.over, func(r Result) float64 { return r.OverP50 }, 0.50), pooled(runs, a.over, func(r Result) float64 { return r.OverP99 }, 0.99)
	a.OverMax = pooled(runs, a.over, func(r Result) float64 { return r.OverMax }, 1)
	if a.WaitN > 0 {
		a.WaitP50, a.WaitP99 = pooled(runs, a.waits, func(r Result) float64 { return r.WaitP50 }, 0.50), pooled(runs, a.waits, func(r Result) float64 { return r.WaitP99 }, 0.99)
	}
	if len(runs) == 1 {
		a.Run = runs[0].Run
	}
	w.Result = a
}

// pooled returns the p-th percentile of the samples of every run, or, for
// results that carry no samples (read back from JSON), the largest of the
// runs' own figures.
func pooled(runs []Result, samples []time.Duration, fig func(Result) float64, p float64) float64 {
	if len(samples) > 0 {
		return percentileMS(samples, p)
	}
	v := math.NaN()
	for _, r := range runs {
		if f := fig(r); !math.IsNaN(f) && (math.IsNaN(v) || f > v) {
			v = f
		}
	}
	return v
}

// PrintTable writes the rows as an aligned text table. With several runs
// per row, the avoidable 429 column adds how many runs had any, and a
// column of the lowest utilization of a run follows. When a row has a
// shared store, columns of its cost follow: Redis commands sent and
// executed per 2xx, Redis CPU per 2xx and per second, and the 2xx per
// second one Redis core would carry (see [Result]). The procs column reads
// "16w" for 16 workers in one process ([Options].Workers). Runs with
// faults add columns of them: the freezes of worker processes and their
// total length in seconds, and the restarts of Redis.
func PrintTable(w io.Writer, rows []Row) {
	store, repeated, frozen, restarted := false, false, false, false
	for _, r := range rows {
		store = store || r.StoreCommands > 0 || r.StoreSeconds > 0
		repeated = repeated || r.Runs > 1
		frozen = frozen || r.Freeze != ""
		restarted = restarted || r.RedisOutage > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "scenario\tlimiter\tprocs\t"
	if repeated {
		head += "runs\t"
	}
	head += "ok/s\tmax/s\tutil\t"
	if repeated {
		head += "min util\t"
	}
	head += "avoidable 429\tunavoidable 429\tuser/global/shared\tedge 429\t401\tbans\tlate p50 ms\tlate p99 ms\tdeadline +p99/+max ms\turgent wait p50/p99 ms\t"
	if store {
		head += "sent/2xx\texec/2xx\tcpu µs/2xx\tcpu ms/s\t2xx/s/core\t"
	}
	if frozen {
		head += "freezes (s), in flight\t"
	}
	if restarted {
		head += "redis restarts\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rows {
		dl := "-"
		if r.OverN > 0 {
			dl = fmt.Sprintf("%.1f/%.1f", r.OverP99, r.OverMax)
		}
		procs := strconv.Itoa(r.Procs)
		if r.Workers > 0 {
			procs = strconv.Itoa(r.Workers) + "w"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t", r.Scenario, r.Limiter, procs)
		if repeated {
			fmt.Fprintf(tw, "%d\t", r.Runs)
		}
		fmt.Fprintf(tw, "%.1f\t%.1f\t%.3f\t", r.PerSecond, r.MaxPerSecond, r.Utilization)
		if repeated {
			fmt.Fprintf(tw, "%.3f\t", r.MinUtilization)
		}
		avoidable := strconv.Itoa(r.Avoidable)
		if repeated {
			avoidable = fmt.Sprintf("%d (%d/%d runs)", r.Avoidable, r.AvoidableRuns, r.Runs)
		}
		wait := "-"
		if r.WaitN > 0 {
			wait = fmt.Sprintf("%.0f/%.0f", r.WaitP50, r.WaitP99)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d/%d/%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t",
			avoidable, r.Unavoidable, r.User, r.Global, r.Shared, r.Edge, r.Unauthorized, r.Bans, ms(r.LateP50), ms(r.LateP99), dl, wait)
		if store {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t", figure(r.StoreSentPer2xx, "%.2f"), figure(r.StoreExecPer2xx, "%.2f"),
				figure(r.StoreCPUPer2xx, "%.1f"), figure(r.StoreCPUPerSecond, "%.2f"), figure(r.Store2xxPerCore, "%.0f"))
		}
		if frozen {
			fmt.Fprintf(tw, "%d (%.1f), %d\t", r.Freezes, r.FrozenSeconds, r.InFlight)
		}
		if restarted {
			fmt.Fprintf(tw, "%d\t", r.RedisRestarts)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

// figure formats a store figure, "-" for none.
func figure(v float64, format string) string {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return "-"
	}
	return fmt.Sprintf(format, v)
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}
