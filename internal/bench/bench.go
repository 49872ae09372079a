// Package bench is the load benchmark behind "ratecord bench": scenarios
// that drive rate-limit clients against the discordtest emulator and measure
// what the emulator saw. Clients are pluggable, so peers (no limiter at all,
// discordgo's limiter) are measured in the same run as ratecord.
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
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
	New  func(base http.RoundTripper) Client
	// NewRun, if set, is called instead of New with the id of the scenario
	// run, the same in every process of the run and different in every
	// run: a shared store keys the run's state with it.
	NewRun func(run string, base http.RoundTripper) Client
	// Cleanup, if set, is called with the run's id once the run ended, in
	// the process that owns the emulator.
	Cleanup func(run string)
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
	return Limiter{Name: "none", New: func(base http.RoundTripper) Client {
		return HTTPClient{C: &http.Client{Transport: base}}
	}}
}

// Env is what a scenario's load sees.
type Env struct {
	// API is the emulator's base URL, ending in /api/v10.
	API string
	// Client sends requests.
	Client Client
	// Part and Parts split the load between processes: a process runs its
	// share of the goroutines.
	Part, Parts int
	rec         *recorder
}

// Goroutines runs n goroutines of f, this process's share of them, until
// ctx ends.
func (e *Env) Goroutines(ctx context.Context, n int, f func(ctx context.Context, g int)) {
	var wg sync.WaitGroup
	for g := e.Part; g < n; g += e.Parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f(ctx, g)
			}
		}()
	}
	wg.Wait()
}

// Overshoot records how long after its deadline a request returned.
func (e *Env) Overshoot(d time.Duration) { e.rec.add(d) }

// Scenario is one workload with the emulator configuration it runs against.
type Scenario struct {
	Name string
	// Emulator configures the emulator.
	Emulator []discordtest.Option
	// Load drives requests until ctx ends.
	Load func(ctx context.Context, env *Env)
	// Control, if set, runs beside the load in the process that owns the
	// emulator (live changes).
	Control func(ctx context.Context, srv *discordtest.Server, d time.Duration)
	// Max is the most successful requests the emulator's limits allow in d.
	Max func(d time.Duration) float64
	// Counted selects the successes compared with Max (nil: all).
	Counted func(e discordtest.LogEntry) bool
	// Late, if set, returns for the counted successes how late each one that
	// waited for a slot arrived after the slot opened.
	Late func(log []discordtest.LogEntry) []time.Duration
	// Deadline marks the scenario whose requests carry short deadlines.
	Deadline bool
}

// Result is one row of the table.
type Result struct {
	Scenario     string  `json:"scenario"`
	Limiter      string  `json:"limiter"`
	Procs        int     `json:"procs"`
	Seconds      float64 `json:"seconds"`
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
	Errors       int     `json:"client_errors"`
	// StoreCommands counts the commands every process sent to a shared
	// store (Redis), and StorePerRequest divides them by Requests; both
	// are zero for limiters without one.
	StoreCommands   int64   `json:"redis_commands,omitempty"`
	StorePerRequest float64 `json:"redis_commands_per_request,omitempty"`
}

// Options of a run.
type Options struct {
	Duration time.Duration
	Procs    int
	// Spawn starts a worker process for part of the load of the scenario
	// run with id run and returns its report; nil runs everything in this
	// process.
	Spawn func(ctx context.Context, run, scenario, limiter, url string, part, parts int, d time.Duration) (WorkerReport, error)
	// Progress receives a line per run; may be nil.
	Progress io.Writer
}

// Run measures every limiter on every scenario.
func Run(ctx context.Context, scenarios []Scenario, limiters []Limiter, o Options) ([]Result, error) {
	var out []Result
	for _, sc := range scenarios {
		for _, lim := range limiters {
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, "bench: %-14s %-10s %d proc(s), %v ...", sc.Name, lim.Name, max(o.Procs, 1), o.Duration)
			}
			start := time.Now()
			r, err := runOne(ctx, sc, lim, o)
			if err != nil {
				return out, fmt.Errorf("%s/%s: %w", sc.Name, lim.Name, err)
			}
			if o.Progress != nil {
				fmt.Fprintf(o.Progress, " %.0f ok/s, utilization %.3f, %d avoidable 429s (%.1fs)\n", r.PerSecond, r.Utilization, r.Avoidable, time.Since(start).Seconds())
			}
			out = append(out, r)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
		}
	}
	return out, nil
}

func runOne(ctx context.Context, sc Scenario, lim Limiter, o Options) (Result, error) {
	opts := append([]discordtest.Option{discordtest.WithLogLimit(2_000_000)}, sc.Emulator...)
	srv, err := discordtest.Start(opts...)
	if err != nil {
		return Result{}, err
	}
	defer srv.Close()
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
	if sc.Control != nil {
		wg.Add(1)
		go func() { defer wg.Done(); sc.Control(runCtx, srv, o.Duration) }()
	}
	if procs == 1 || o.Spawn == nil {
		RunLoad(runCtx, run, sc, lim, srv.URL(), 0, 1, rec)
	} else {
		for p := 0; p < procs; p++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep, err := o.Spawn(ctx, run, sc.Name, lim.Name, srv.URL(), p, procs, o.Duration)
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
	if spawnErr != nil {
		return Result{}, spawnErr
	}
	st := srv.Stats()
	return summarize(sc, lim.Name, procs, start, o.Duration, st, rec), nil
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
	if rec == nil {
		rec = &recorder{}
	}
	base := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, IdleConnTimeout: 30 * time.Second}
	defer base.CloseIdleConnections()
	var c Client
	if lim.NewRun != nil {
		c = lim.NewRun(run, base)
	} else {
		c = lim.New(base)
	}
	defer c.Close()
	env := &Env{API: url + "/api/v10", Client: c, Part: part, Parts: parts, rec: rec}
	sc.Load(ctx, env)
	if cc, ok := c.(CommandCounter); ok {
		rec.mu.Lock()
		rec.commands += cc.StoreCommands()
		rec.counted = true
		rec.mu.Unlock()
	}
}

// WorkerReport is what a worker process tells the process that owns the
// emulator, as JSON on its standard output.
type WorkerReport struct {
	// Overshoots are how long after their deadlines requests returned.
	Overshoots []time.Duration `json:"overshoots"`
	// StoreCommands counts the commands sent to a shared store; Counted
	// reports whether the limiter has one.
	StoreCommands int64 `json:"store_commands"`
	Counted       bool  `json:"counted"`
	// Errors counts requests that got no response.
	Errors int `json:"errors"`
}

// RunWorker is the body of a worker process: it runs its part of the
// scenario run run and writes its [WorkerReport] to w as JSON.
func RunWorker(ctx context.Context, run string, sc Scenario, lim Limiter, url string, part, parts int, d time.Duration, w io.Writer) error {
	ctx, cancel := runContext(ctx, d)
	defer cancel()
	rec := &recorder{}
	RunLoad(ctx, run, sc, lim, url, part, parts, rec)
	rec.mu.Lock()
	rep := WorkerReport{Overshoots: append([]time.Duration(nil), rec.over...), StoreCommands: rec.commands, Counted: rec.counted, Errors: rec.errors}
	rec.mu.Unlock()
	return json.NewEncoder(w).Encode(rep)
}

func summarize(sc Scenario, limiter string, procs int, start time.Time, d time.Duration, st discordtest.Stats, rec *recorder) Result {
	r := Result{LateP50: math.NaN(), LateP99: math.NaN(), Scenario: sc.Name, Limiter: limiter, Procs: procs, Seconds: d.Seconds(), Requests: st.Requests,
		Avoidable: st.Avoidable, Unavoidable: st.Unavoidable, User: st.ByScope["user"], Global: st.ByScope["global"],
		Shared: st.ByScope["shared"], Unauthorized: st.ByStatus[401], Bans: st.Bans, Banned: st.BannedResponses}
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
	r.Successes = len(counted)
	r.PerSecond = float64(r.Successes) / d.Seconds()
	if sc.Max != nil {
		m := sc.Max(d)
		r.MaxPerSecond = m / d.Seconds()
		if m > 0 {
			r.Utilization = float64(r.Successes) / m
		}
	}
	if sc.Late != nil {
		late := sc.Late(counted)
		r.LateN = len(late)
		r.LateP50, r.LateP99 = percentileMS(late, 0.50), percentileMS(late, 0.99)
	}
	if sc.Deadline {
		over := rec.all()
		r.OverN = len(over)
		r.OverP50, r.OverP99, r.OverMax = percentileMS(over, 0.50), percentileMS(over, 0.99), percentileMS(over, 1)
	}
	r.Errors = rec.errors
	if rec.counted {
		r.StoreCommands = rec.commands
		if st.Requests > 0 {
			r.StorePerRequest = float64(rec.commands) / float64(st.Requests)
		}
	}
	return r
}

type recorder struct {
	mu       sync.Mutex // guards every field below
	over     []time.Duration
	errors   int
	commands int64
	counted  bool
}

// merge adds a worker's report.
func (r *recorder) merge(rep WorkerReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = append(r.over, rep.Overshoots...)
	r.errors += rep.Errors
	r.commands += rep.StoreCommands
	r.counted = r.counted || rep.Counted
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

// PrintTable writes the results as an aligned text table. A column of
// Redis commands per request follows when a row has a shared store.
func PrintTable(w io.Writer, rs []Result) {
	store := false
	for _, r := range rs {
		store = store || r.StoreCommands > 0
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "scenario\tlimiter\tprocs\tok/s\tmax/s\tutil\tavoidable 429\tunavoidable 429\tuser/global/shared\t401\tbans\tlate p50 ms\tlate p99 ms\tdeadline +p99/+max ms\t"
	if store {
		head += "redis cmd/req\t"
	}
	fmt.Fprintln(tw, head)
	for _, r := range rs {
		dl := "-"
		if r.OverN > 0 {
			dl = fmt.Sprintf("%.1f/%.1f", r.OverP99, r.OverMax)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.1f\t%.1f\t%.3f\t%d\t%d\t%d/%d/%d\t%d\t%d\t%s\t%s\t%s\t",
			r.Scenario, r.Limiter, r.Procs, r.PerSecond, r.MaxPerSecond, r.Utilization, r.Avoidable, r.Unavoidable,
			r.User, r.Global, r.Shared, r.Unauthorized, r.Bans, ms(r.LateP50), ms(r.LateP99), dl)
		if store {
			per := "-"
			if r.StoreCommands > 0 {
				per = fmt.Sprintf("%.2f", r.StorePerRequest)
			}
			fmt.Fprintf(tw, "%s\t", per)
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
}

func ms(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}
