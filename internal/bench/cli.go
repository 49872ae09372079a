package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ratecord/ratecord"
	"github.com/ratecord/ratecord/discordtest"
	"github.com/ratecord/ratecord/store"
	"github.com/ratecord/ratecord/store/memstore"
)

// Ratecord is the contender: a ratecord Transport over the base transport,
// with its invalid-request guard at half the emulator's ban threshold.
func Ratecord() Limiter {
	return Limiter{Name: "ratecord", New: func(base http.RoundTripper, cfg ClientConfig) Client {
		tr := ratecord.NewTransport(base, ratecord.WithStore(memstore.New(memstore.WithPolicy(policy(cfg)))))
		return HTTPClient{C: &http.Client{Transport: tr}, Close_: tr.Close}
	}}
}

// policy is the stores' policy for a run: the run's global limit, if
// raised, and the invalid-request guard at half the emulator's ban
// threshold.
func policy(cfg ClientConfig) store.Policy {
	return store.Policy{GlobalLimit: cfg.GlobalLimit, InvalidBudget: invalidLimit / 2}
}

// Main is the "bench" command: it parses args, runs the suite with the
// given limiters and prints the table (or JSON). With -check it fails when
// a run of a ratecord row shows an avoidable 429, a ban, or a request that
// returned more than 5 ms after its deadline.
//
// -scenario takes scenario names and the sets "default" (the suite of
// [Scenarios], run when -scenario is not given), "unannounced" (the limits
// no header announces, [Unannounced]), "throughput" (answers that leave a
// client to find the most it may send, [Throughput]) and "all".
//
// -latency picks the emulator's network profile ([discordtest.NetworkProfile]),
// -repeat runs every scenario and limiter several times: each row then
// gives the figures of all its runs and how many runs had an avoidable 429,
// and the JSON output holds every run's figures.
//
// With -redis (or -redis-cluster), ratecord runs twice: as ratecord-redis,
// whose processes share a redisstore.Store with a key prefix unique to the
// scenario run, and as ratecord-mem, with a memory store per process; the
// table then shows for ratecord-redis the Redis commands sent and executed
// per 2xx, Redis CPU per 2xx and per second, and the 2xx per second one
// Redis core would carry. The limiters given with [Limiter].Redis set run
// only then, on the same Redis, and get the same columns.
//
// -workers N runs the load as N workers inside this process instead of
// -procs processes: each has what a process of its own would have (for
// ratecord-redis its own go-redis client and connection pool, store and
// ratecord transport; its own HTTP transport) and runs at most -goroutines
// goroutines of every load group of a scenario, so the load grows with N;
// the scenarios whose emulator bans after a number of requests into a
// block (edge-block, html-429) keep their callers, split across the
// workers as across processes (see Scenario.FixedLoad).
//
// Two flags inject faults into every run. -freeze MIN-MAX (with -procs 2
// or more) stops one worker process at a time with SIGSTOP for a duration
// drawn uniformly from [MIN, MAX] and continues it with SIGCONT, after a
// pause drawn uniformly from [0, 1 s), from the start of each run to its
// end; see [Options].Freeze. -redis-restart DUR starts a redis-server of
// its own on a free loopback port, without persistence, measures the
// Redis limiters on it, and in each run kills it with SIGKILL a third of
// the way in and starts it again, empty, on the same port DUR later; a run
// then lasts at least 1.5 × (DUR + 5 s), so that the server is back 5 s
// before the end or earlier. -trace-avoidable FILE writes, per run, its
// faults and each avoidable 429 with the attempt it was, as JSON lines.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer, limiters ...Limiter) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		duration  = fs.Duration("duration", 3*time.Second, "how long each scenario runs per limiter (edge-block, html-429, edge-below: at least 20s)")
		scenario  = fs.String("scenario", SetDefault, "comma-separated scenarios or sets of them: "+SetDefault+" (the default suite), "+SetUnannounced+" (limits no header announces), "+SetThroughput+" (answers that leave the client to find the most it may send), "+SetAll)
		procs     = fs.Int("procs", 1, "worker processes sharing the load (each with its own memory store, or one Redis with -redis)")
		workers   = fs.Int("workers", 0, "run `N` workers in this process instead of -procs processes, each with its own clients and store (meant for -redis), each running up to -goroutines goroutines of every load group (edge-block and html-429: their callers split across the workers)")
		perWorker = fs.Int("goroutines", 4, "with -workers, the most goroutines a worker runs per load group (`G`)")
		asJSON    = fs.Bool("json", false, "print results as JSON instead of a table")
		only      = fs.String("limiters", "", "comma-separated limiters to run (default: all)")
		check     = fs.Bool("check", false, "exit non-zero when any run of ratecord has an avoidable 429, a ban or a late deadline")
		latency   = fs.String("latency", discordtest.ProfileLAN, "network between the clients and the emulator: "+strings.Join(discordtest.NetworkProfiles(), ", ")+" (see docs/benchmarks.md)")
		repeat    = fs.Int("repeat", 1, "run every scenario with every limiter `N` times; rows aggregate the runs")
		worker    = fs.Bool("worker", false, "internal: run as a worker process")
		url       = fs.String("url", "", "internal: emulator URL for a worker")
		part      = fs.Int("part", 0, "internal: this worker's part")
		parts     = fs.Int("parts", 1, "internal: number of parts")
		limiterNm = fs.String("limiter", "", "internal: the worker's limiter")
		run       = fs.String("run", "", "internal: the id of the worker's scenario run")
		redisAddr = fs.String("redis", "", "also measure ratecord with a Redis store on the server at `ADDR` (ratecord-redis), beside memory stores (ratecord-mem), and any contender that keeps its state in Redis")
		redisCl   = fs.String("redis-cluster", "", "like -redis, with a Redis Cluster: comma-separated seed `ADDRS`")
		freeze    = fs.String("freeze", "", "with -procs 2 or more, stop one random worker process at a time (SIGSTOP) for a random duration in `MIN-MAX` (such as 300ms-1500ms), then continue it (SIGCONT), with a random pause of 0 to 1s between freezes, for the whole of each run")
		restart   = fs.Duration("redis-restart", 0, "start a redis-server of this bench's own on a free loopback port, use it as -redis, and in each run kill it (SIGKILL) a third of the way in and start it again, empty, `DUR` later; runs last at least 1.5 × (DUR + 5s)")
		traceTo   = fs.String("trace-avoidable", "", "write to `FILE` as JSON lines, per run, its faults and each avoidable 429 with the request it was: the worker that sent it, when, and its freezes")
		traced    = fs.Bool("trace", false, "internal: a worker records every request it sends")
	)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: ratecord bench [flags]\n\nDrives load scenarios through rate limiters against an in-process Discord emulator\nand prints, per scenario and limiter, successful requests per second, the maximum the\nemulator's limits allow, utilization, 429s by scope (avoidable and unavoidable), bans,\nand how late requests left after their slot opened.\n\nScenarios (%s): %s\nScenarios (%s): %s\nScenarios (%s): %s\n\nFlags:\n",
			SetDefault, strings.Join(names(Scenarios(discordtest.Network{})), ", "),
			SetUnannounced, strings.Join(names(Unannounced(discordtest.Network{})), ", "),
			SetThroughput, strings.Join(names(Throughput(discordtest.Network{})), ", "))
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	network, ok := discordtest.NetworkProfile(*latency)
	if !ok {
		return fmt.Errorf("unknown -latency %q (have %s)", *latency, strings.Join(discordtest.NetworkProfiles(), ", "))
	}
	if *repeat < 1 {
		return fmt.Errorf("-repeat %d: want at least 1", *repeat)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	switch {
	case *workers < 0:
		return fmt.Errorf("-workers %d: want at least 1", *workers)
	case *workers > 0 && set["procs"]:
		return errors.New("-workers and -procs are exclusive: workers run in one process, procs each in its own")
	case set["goroutines"] && *workers == 0:
		return errors.New("-goroutines applies to -workers only")
	case *perWorker < 1:
		return fmt.Errorf("-goroutines %d: want at least 1", *perWorker)
	case *restart < 0:
		return fmt.Errorf("-redis-restart %v: want a positive duration", *restart)
	case *restart > 0 && (*redisAddr != "" || *redisCl != ""):
		return errors.New("-redis-restart starts a Redis of its own: leave out -redis and -redis-cluster")
	}
	var freezeRange FreezeRange
	if *freeze != "" && !*worker {
		r, err := ParseFreezeRange(*freeze)
		switch {
		case err != nil:
			return err
		case !canFreeze:
			return fmt.Errorf("-freeze: %w", errNoFreeze)
		case *workers > 0:
			return errors.New("-freeze stops worker processes: -workers runs its workers in this process; use -procs")
		case *procs < 2:
			return fmt.Errorf("-freeze needs -procs 2 or more (have %d): it stops one worker process while the others go on", *procs)
		}
		freezeRange = r
	}
	if *traced {
		ctx = withTrace(ctx)
	}
	var outage *RedisOutage
	if *restart > 0 && !*worker {
		srv, err := StartRedis(ctx)
		if err != nil {
			return err
		}
		defer srv.Close()
		*redisAddr = srv.Addr
		outage = &RedisOutage{Server: srv, Down: *restart}
	}
	all := []Limiter{Ratecord(), NoLimiter()}
	var redisArgs []string
	var rc *RedisConfig
	if *redisAddr != "" || *redisCl != "" {
		rc = &RedisConfig{Addr: *redisAddr}
		redisArgs = []string{"-redis", *redisAddr}
		if *redisCl != "" {
			rc.Cluster = strings.Split(*redisCl, ",")
			redisArgs = []string{"-redis-cluster", *redisCl}
		}
		if !*worker {
			if err := rc.Ping(ctx); err != nil {
				return fmt.Errorf("redis: %w", err)
			}
		}
		all = []Limiter{RatecordRedis(*rc), RatecordMemory(), NoLimiter()}
	}
	// The server's counters start again from zero when it restarts: the
	// Redis cost of a run with an outage is not measured.
	noProbe := func(l Limiter) Limiter {
		if outage != nil {
			l.Probe = nil
		}
		return l
	}
	for i := range all {
		all[i] = noProbe(all[i])
	}
	needRedis := map[string]bool{}
	for _, l := range limiters {
		switch {
		case l.Redis == nil:
			all = append(all, l)
		case rc != nil:
			own := noProbe(l.Redis(*rc))
			own.Name = l.Name
			all = append(all, own)
		default:
			needRedis[l.Name] = true
		}
	}
	scs, err := pick(network, *scenario)
	if err != nil {
		return err
	}
	if *worker {
		lim, ok := findLimiter(all, *limiterNm)
		if !ok || len(scs) != 1 {
			return fmt.Errorf("worker: unknown limiter %q or scenario %q", *limiterNm, *scenario)
		}
		return RunWorker(ctx, *run, scs[0], lim, *url, *part, *parts, *duration, stdout)
	}
	lims := all
	if *only != "" {
		lims = nil
		for _, n := range strings.Split(*only, ",") {
			n = strings.TrimSpace(n)
			l, ok := findLimiter(all, n)
			switch {
			case !ok && (needRedis[n] || n == NameRedis):
				return fmt.Errorf("limiter %q needs -redis or -redis-cluster", n)
			case !ok:
				return fmt.Errorf("unknown limiter %q", n)
			}
			lims = append(lims, l)
		}
	}
	opts := Options{Duration: *duration, Procs: *procs, Network: network, Latency: *latency, Repeat: *repeat, Progress: stderr,
		Freeze: freezeRange, Outage: outage}
	if *traceTo != "" {
		f, err := os.Create(*traceTo)
		if err != nil {
			return err
		}
		defer f.Close()
		opts.Trace = f
	}
	if *workers > 0 {
		opts.Procs, opts.Workers, opts.Goroutines = 1, *workers, *perWorker
	}
	if opts.Procs > 1 {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		// The worker re-runs this program; its first argument is whatever
		// selects the bench command ("bench" for cmd/ratecord).
		prefix := benchPrefix(args)
		opts.Spawn = func(ctx context.Context, run, sc, lim, url string, part, parts int, d time.Duration) (WorkerReport, error) {
			cmdArgs := append(append([]string{}, prefix...), "-worker", "-run", run, "-scenario", sc, "-limiter", lim, "-url", url,
				"-part", strconv.Itoa(part), "-parts", strconv.Itoa(parts), "-duration", d.String(), "-latency", *latency)
			cmdArgs = append(cmdArgs, redisArgs...)
			if tracing(ctx) {
				cmdArgs = append(cmdArgs, "-trace")
			}
			cmd := exec.CommandContext(ctx, exe, cmdArgs...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, stderr
			if opts.Freeze.Max > 0 {
				// A worker stopped when this process dies is killed, not
				// left stopped.
				dieWithParent(cmd)
			}
			if err := cmd.Start(); err != nil {
				return WorkerReport{}, fmt.Errorf("worker %d: %w", part, err)
			}
			done := Started(ctx, part, cmd.Process)
			err := cmd.Wait()
			done()
			if err != nil {
				return WorkerReport{}, fmt.Errorf("worker %d: %w", part, err)
			}
			var rep WorkerReport
			if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
				return WorkerReport{}, fmt.Errorf("worker %d output: %w", part, err)
			}
			return rep, nil
		}
	}
	start := time.Now()
	rs, err := Run(ctx, scs, lims, opts)
	if err != nil {
		return err
	}
	rows := Aggregate(rs)
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(sanitize(rows)); err != nil {
			return err
		}
	} else {
		PrintTable(stdout, rows)
		fmt.Fprintf(stdout, "\n%d runs in %.1fs, latency %s (%s); utilization = successful requests / the most the emulator's limits allow,\nboth from the first counted success's arrival to the end of the run.",
			len(rs), time.Since(start).Seconds(), *latency, describe(network))
		for _, sc := range scs {
			switch {
			case sc.Deadline > 0 && sc.Deadline == DeadlineFor(network):
				fmt.Fprintf(stdout, " %s: every request carries a %v deadline (50 ms + the longest round trip).", sc.Name, sc.Deadline)
			case sc.Deadline > 0:
				fmt.Fprintf(stdout, " %s: every request carries a %v deadline.", sc.Name, sc.Deadline)
			}
			if sc.LateNote != "" {
				fmt.Fprintf(stdout, " %s: the late columns show %s.", sc.Name, sc.LateNote)
			}
			if sc.WaitNote != "" {
				fmt.Fprintf(stdout, " %s: the urgent wait column shows %s.", sc.Name, sc.WaitNote)
			}
		}
		if freezeRange.Max > 0 {
			fmt.Fprintf(stdout, "\nfreezes (s): one worker process at a time stopped (SIGSTOP) for a uniformly random %v to %v, then continued (SIGCONT), after a uniformly random pause of 0 to %v; the freezes of the row's runs and their total length; in flight: the requests a freeze caught between their hand-off to the network and their write, whose 429s (and those of the windows they filled) the emulator judges unavoidable.",
				freezeRange.Min, freezeRange.Max, freezeGap)
		}
		if outage != nil {
			fmt.Fprintf(stdout, "\nredis restarts: the bench's own redis-server (%s, no persistence) killed (SIGKILL) a third of the way into each run and started again, empty, %v later; runs last at least %v. The Redis cost of such runs is not measured.",
				outage.Server.Addr, outage.Down, outage.runLength(0))
		}
		if *workers > 0 {
			fmt.Fprintf(stdout, "\n%dw: %d workers in this process, each with its own clients, store and HTTP transport, as a process would have, each running up to %d goroutines of every load group (edge-block and html-429: their callers split across the workers, since their emulator bans after a number of requests into a block).",
				*workers, *workers, *perWorker)
		}
		for _, r := range rows {
			if sc, ok := findScenario(scs, r.Scenario); ok && sc.Renames {
				fmt.Fprintf(stdout, "\n%s/%s: %d renames sent to Discord while a rename issued earlier (by 1 ms or more, same process) still waited.",
					r.Scenario, r.Limiter, r.Overtaken)
			}
			if r.Bare > 0 {
				fmt.Fprintf(stdout, "\n%s/%s: %d bare 429s (Retry-After only: no rate-limit headers, no scope, no body), counted as avoidable or unavoidable, not by scope.",
					r.Scenario, r.Limiter, r.Bare)
			}
			if r.Calls > 0 {
				fmt.Fprintf(stdout, "\n%s/%s: %d of %d calls (%.1f%%) canceled in flight, %v after leaving; the emulator wrote %d responses to no one.",
					r.Scenario, r.Limiter, r.Canceled, r.Calls, 100*float64(r.Canceled)/float64(r.Calls), cancelAfter, r.Lost)
			}
			if r.Refused > 0 {
				fmt.Fprintf(stdout, "\n%s/%s: %d requests refused at once by the limiter, as the scenario expects (%.0f/s).",
					r.Scenario, r.Limiter, r.Refused, float64(r.Refused)/max(r.Seconds+r.Warmup*float64(r.Runs), 1e-9))
			}
		}
		storeFooter(stdout, rows)
		fmt.Fprintln(stdout)
	}
	if *check {
		return Check(rs)
	}
	return nil
}

// storeFooter explains the store columns of the table, if any row has
// them, with the server's idle rate as measured for each limiter.
func storeFooter(w io.Writer, rows []Row) {
	var lims, idle []string
	seen := map[string]bool{}
	for _, r := range rows {
		if r.StoreSeconds <= 0 || seen[r.Limiter] {
			continue
		}
		seen[r.Limiter] = true
		lims = append(lims, r.Limiter)
		idle = append(idle, fmt.Sprintf("%.3f ms/s for %s", r.StoreIdleRate, r.Limiter))
	}
	if len(lims) == 0 {
		return
	}
	fmt.Fprintf(w, "\nRedis (%s): sent/2xx = commands the clients sent (go-redis hook, every worker) per 2xx the emulator answered;"+
		" exec/2xx = commands Redis executed (INFO commandstats calls, script-run commands included, the measurement's INFO not) per 2xx;"+
		"\ncpu µs/2xx and cpu ms/s = Redis CPU (INFO cpu, sys + user) during the run less its idle rate (%s), measured over %.0fs before the limiter's first run;"+
		" 2xx/s/core = 2xx per second / Redis CPU seconds per second.",
		strings.Join(lims, ", "), strings.Join(idle, ", "), idleSpan.Seconds())
}

// describe says what a network profile is, for the table's footer.
func describe(n discordtest.Network) string {
	leg := func(l discordtest.Leg) string {
		s := fmt.Sprintf("%v + up to %v", l.Base, l.Jitter)
		if l.StallEvery > 0 && l.Stall > 0 {
			s += fmt.Sprintf(", 1 in %d stalls %v", l.StallEvery, l.Stall)
		}
		return s
	}
	return "up " + leg(n.Up) + "; down " + leg(n.Down)
}

// Check reports the goals the runs of the ratecord and ratecord-redis rows
// miss: an avoidable 429, a ban, or a deadline request that returned more
// than 5 ms late, in any run. ratecord-mem rows are not checked: with
// several processes their memory stores overshoot by design.
func Check(rs []Result) error {
	var errs []error
	for _, r := range rs {
		if err := checkRun(r); err != nil {
			errs = append(errs, fmt.Errorf("%s/%s run %d: %w", r.Scenario, r.Limiter, r.Run, err))
		}
	}
	return errors.Join(errs...)
}

// checkRun reports the goals one run misses; only ratecord and
// ratecord-redis runs have goals.
func checkRun(r Result) error {
	if r.Limiter != "ratecord" && r.Limiter != NameRedis {
		return nil
	}
	var errs []error
	if r.Avoidable > 0 {
		errs = append(errs, fmt.Errorf("%d avoidable 429s", r.Avoidable))
	}
	if r.Bans > 0 || r.Banned > 0 {
		errs = append(errs, errors.New("banned"))
	}
	if r.OverN > 0 && r.OverMax > 5 {
		errs = append(errs, fmt.Errorf("a request returned %.1f ms after its deadline", r.OverMax))
	}
	if r.Scenario == "deadline" && r.User+r.Global > 0 {
		errs = append(errs, fmt.Errorf("%d 429s", r.User+r.Global))
	}
	return errors.Join(errs...)
}

// benchPrefix returns the arguments before the bench flags for a worker:
// nothing when the program is the bench itself, "bench" for cmd/ratecord.
func benchPrefix(args []string) []string {
	if len(os.Args) > len(args) && os.Args[len(os.Args)-len(args)-1] == "bench" {
		return []string{"bench"}
	}
	return nil
}

// sanitize replaces NaN (no samples) by 0, which JSON can hold, in the
// rows and their runs.
func sanitize(rows []Row) []Row {
	out := append([]Row(nil), rows...)
	clean := func(r *Result) {
		for _, f := range []*float64{&r.LateP50, &r.LateP99, &r.OverP50, &r.OverP99, &r.OverMax} {
			if math.IsNaN(*f) {
				*f = 0
			}
		}
	}
	for i := range out {
		clean(&out[i].Result)
		out[i].PerRun = append([]Result(nil), out[i].PerRun...)
		for j := range out[i].PerRun {
			clean(&out[i].PerRun[j])
		}
	}
	return out
}

func names(scs []Scenario) []string {
	var n []string
	for _, s := range scs {
		n = append(n, s.Name)
	}
	return n
}

// pick returns the scenarios for network n that list names: scenario names
// and the sets SetDefault (also the empty list), SetUnannounced,
// SetThroughput and SetAll, separated by commas.
func pick(n discordtest.Network, list string) ([]Scenario, error) {
	def, un, th := Scenarios(n), Unannounced(n), Throughput(n)
	all := append(append(append([]Scenario(nil), def...), un...), th...)
	if list == "" {
		return def, nil
	}
	var out []Scenario
	for _, name := range strings.Split(list, ",") {
		switch name = strings.TrimSpace(name); name {
		case SetDefault:
			out = append(out, def...)
		case SetUnannounced:
			out = append(out, un...)
		case SetThroughput:
			out = append(out, th...)
		case SetAll:
			out = append(out, all...)
		default:
			found := false
			for _, s := range all {
				if s.Name == name {
					out = append(out, s)
					found = true
				}
			}
			if !found {
				return nil, fmt.Errorf("unknown scenario %q (have %s, %s, %s, %s, %s)", name, strings.Join(names(all), ", "), SetDefault, SetUnannounced, SetThroughput, SetAll)
			}
		}
	}
	return out, nil
}

func findScenario(scs []Scenario, name string) (Scenario, bool) {
	for _, s := range scs {
		if s.Name == name {
			return s, true
		}
	}
	return Scenario{}, false
}

func findLimiter(ls []Limiter, name string) (Limiter, bool) {
	for _, l := range ls {
		if l.Name == name {
			return l, true
		}
	}
	return Limiter{}, false
}
