// Command proxybench measures "ratecord proxy" against the upstream it
// forwards to, in one run: it builds the proxy, the no-limit upstream
// (cmd/nolimit) and the load generator (cmd/loadgen), starts the upstream
// and the proxy on loopback addresses, and then, round after round, drives
// the upstream directly and through the proxy with the same closed-loop
// load. Each round reports both rates and their ratio, so that a machine
// shared with other work shows as a spread of ratios rather than as a wrong
// absolute number. A last phase sends requests over many webhook routes
// through a fresh proxy. The proxy's CPU time per request (user and
// system, from /proc/PID/stat) is the figure least disturbed by other work;
// its peak resident size (VmHWM) is read from /proc after each phase:
//
//	cd examples
//	go run ./cmd/proxybench                          # 5 rounds of 5 s, 64 clients
//	go run ./cmd/proxybench -rounds 10 -env GOGC=100 # the proxy with another environment
//	go run ./cmd/proxybench -upstream-engine nethttp # an upstream on net/http's server
//
// Only loopback addresses are used. Linux only (/proc).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	root := flag.String("root", "..", "`directory` of the ratecord module, where cmd/ratecord is built")
	proxyBin := flag.String("proxy", "", "`path` of a built ratecord binary to measure instead of building one")
	rounds := flag.Int("rounds", 5, "rounds of one direct and one proxied run")
	duration := flag.Duration("duration", 5*time.Second, "length of each run, after its warm-up")
	warmup := flag.Duration("warmup", time.Second, "warm-up of each run, not counted")
	clients := flag.Int("clients", 64, "concurrent clients, each with one request in flight")
	routes := flag.Int("routes", 10000, "webhook routes of the last phase; 0 skips it")
	routeRequests := flag.Int("route-requests", 100000, "requests of the last phase")
	engine := flag.String("upstream-engine", "raw", "the upstream's server: raw (minimal HTTP/1.1, cheap on CPU) or nethttp (net/http's server)")
	env := flag.String("env", "", "comma-separated `NAME=value` pairs added to the proxy's environment, such as GOGC=100")
	proxyArgs := flag.String("proxy-args", "", "space-separated extra flags of ratecord proxy")
	keep := flag.Bool("keep-log", false, "keep the proxy's log file and print its path")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, config{
		root: *root, proxyBin: *proxyBin, rounds: *rounds, duration: *duration, warmup: *warmup, clients: *clients,
		routes: *routes, routeRequests: *routeRequests, env: splitList(*env, ","), proxyArgs: strings.Fields(*proxyArgs),
		keepLog: *keep, upstreamEngine: *engine,
	}); err != nil {
		fmt.Fprintln(os.Stderr, "proxybench:", err)
		os.Exit(1)
	}
}

type config struct {
	root, proxyBin       string
	rounds               int
	duration, warmup     time.Duration
	clients              int
	routes               int
	routeRequests        int
	env, proxyArgs       []string
	keepLog              bool
	upstreamEngine       string
	loadgenBin, upstream string
}

func run(ctx context.Context, cfg config) error {
	dir, err := os.MkdirTemp("", "proxybench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if cfg.proxyBin == "" {
		cfg.proxyBin = filepath.Join(dir, "ratecord")
		if err := build(ctx, cfg.root, "./cmd/ratecord", cfg.proxyBin); err != nil {
			return err
		}
	}
	cfg.loadgenBin = filepath.Join(dir, "loadgen")
	nolimitBin := filepath.Join(dir, "nolimit")
	for _, b := range [][2]string{{"./cmd/loadgen", cfg.loadgenBin}, {"./cmd/nolimit", nolimitBin}} {
		if err := build(ctx, ".", b[0], b[1]); err != nil {
			return err
		}
	}

	upAddr, err := freeAddr()
	if err != nil {
		return err
	}
	upstream, err := start(ctx, nil, io.Discard, nolimitBin, "-addr", upAddr, "-engine", cfg.upstreamEngine)
	if err != nil {
		return err
	}
	defer upstream.stop()
	cfg.upstream = "http://" + upAddr
	if err := waitHealthy(ctx, cfg.upstream+"/api/v10/gateway"); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}

	logPath := filepath.Join(dir, "proxy.log")
	if cfg.keepLog {
		if f, err := os.CreateTemp("", "proxybench-*.log"); err == nil {
			logPath = f.Name()
			f.Close()
		}
	}
	fmt.Printf("proxy %s, environment %q, flags %q; upstream %s; %d clients, %v runs after %v warm-up\n",
		cfg.proxyBin, cfg.env, cfg.proxyArgs, cfg.upstreamEngine, cfg.clients, cfg.duration, cfg.warmup)

	p, err := startProxy(ctx, cfg, logPath)
	if err != nil {
		return err
	}
	defer p.stop()
	var direct, proxied, ratios, cpus []float64
	fmt.Printf("%-6s %12s %12s %7s %12s %14s\n", "round", "direct/s", "proxy/s", "ratio", "proxy p99", "proxy CPU/req")
	for i := range cfg.rounds {
		var d, pr load
		// Alternate which goes first, so that a trend in the machine's
		// other load does not favour one side.
		if i%2 == 0 {
			if d, err = cfg.oneRoute(ctx, cfg.upstream, nil); err == nil {
				pr, err = cfg.oneRoute(ctx, p.url, p)
			}
		} else {
			if pr, err = cfg.oneRoute(ctx, p.url, p); err == nil {
				d, err = cfg.oneRoute(ctx, cfg.upstream, nil)
			}
		}
		if err != nil {
			return err
		}
		direct, proxied = append(direct, d.rate), append(proxied, pr.rate)
		ratios, cpus = append(ratios, pr.rate/d.rate), append(cpus, pr.cpuPerRequest)
		fmt.Printf("%-6d %12.0f %12.0f %7.2f %12s %12.1fµs\n", i+1, d.rate, pr.rate, pr.rate/d.rate, pr.p99, pr.cpuPerRequest)
	}
	hwm, rss := p.memory()
	fmt.Printf("one route: direct %s/s, proxy %s/s, ratio %s (median %.2f); proxy CPU %s µs/request; proxy peak RSS %.1f MB (now %.1f MB)\n",
		span(direct, "%.0f"), span(proxied, "%.0f"), span(ratios, "%.2f"), median(ratios), span(cpus, "%.1f"), hwm, rss)
	p.stop()

	if cfg.routes > 0 {
		p, err := startProxy(ctx, cfg, logPath)
		if err != nil {
			return err
		}
		defer p.stop()
		l, err := cfg.manyRoutes(ctx, p.url, p)
		if err != nil {
			return err
		}
		hwm, rss := p.memory()
		fmt.Printf("%d webhook routes, %d requests: proxy %.0f/s, CPU %.1f µs/request; proxy peak RSS %.1f MB (now %.1f MB)\n",
			cfg.routes, cfg.routeRequests, l.rate, l.cpuPerRequest, hwm, rss)
	}
	if cfg.keepLog {
		fmt.Println("proxy log:", logPath)
	}
	return nil
}

// load is what one loadgen run measured.
type load struct {
	rate          float64
	p99           string
	cpuPerRequest float64 // µs of the proxy's CPU time (user and system) per request, whole run
}

var (
	rateLine = regexp.MustCompile(`^requests (\d+) in [0-9.]+s: ([0-9.]+)/s, errors (\d+), statuses map\[(.*)\]`)
	p99Field = regexp.MustCompile(`p99 (\S+)`)
)

// oneRoute runs the closed-loop load on one route of base; the CPU time of
// p, if not nil, is measured.
func (cfg config) oneRoute(ctx context.Context, base string, p *process) (load, error) {
	return cfg.loadgen(ctx, p, cfg.warmup, "-url", base, "-clients", strconv.Itoa(cfg.clients),
		"-duration", cfg.duration.String(), "-warmup", cfg.warmup.String())
}

// manyRoutes sends cfg.routeRequests requests over cfg.routes webhook
// routes.
func (cfg config) manyRoutes(ctx context.Context, base string, p *process) (load, error) {
	return cfg.loadgen(ctx, p, 0, "-url", base, "-clients", strconv.Itoa(cfg.clients),
		"-requests", strconv.Itoa(cfg.routeRequests), "-routes", strconv.Itoa(cfg.routes),
		"-method", "POST", "-body", `{"content":"hello"}`, "-auth", "",
		"-path", "/api/v10/webhooks/%d/loadgen-webhook-token")
}

// loadgen runs the load generator with args and reads what it printed.
// When p is not nil, its CPU time from the end of the warm-up to the end of
// the run is divided among the requests counted.
func (cfg config) loadgen(ctx context.Context, p *process, warmup time.Duration, args ...string) (load, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, cfg.loadgenBin, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return load{}, err
	}
	var cpu0 time.Duration
	if p != nil {
		time.Sleep(warmup)
		cpu0 = p.cpu()
	}
	if err := cmd.Wait(); err != nil {
		return load{}, fmt.Errorf("loadgen %q: %w\n%s", args, err, out.String())
	}
	var cpu time.Duration
	if p != nil {
		cpu = p.cpu() - cpu0
	}
	var l load
	var requests float64
	sc := bufio.NewScanner(&out)
	for sc.Scan() {
		if m := rateLine.FindStringSubmatch(sc.Text()); m != nil {
			if m[3] != "0" || strings.Contains(m[4], " ") || !strings.HasPrefix(m[4], "200:") {
				return load{}, fmt.Errorf("loadgen %q: not every request was answered 200: %s", args, sc.Text())
			}
			l.rate, _ = strconv.ParseFloat(m[2], 64)
			requests, _ = strconv.ParseFloat(m[1], 64)
		} else if m := p99Field.FindStringSubmatch(sc.Text()); m != nil {
			l.p99 = m[1]
		}
	}
	if l.rate == 0 {
		return load{}, fmt.Errorf("loadgen %q: no rate in its output:\n%s", args, out.String())
	}
	if p != nil {
		l.cpuPerRequest = float64(cpu.Microseconds()) / requests
	}
	return l, nil
}

// process is a child process that stop ends.
type process struct {
	cmd  *exec.Cmd
	url  string
	done chan struct{}
}

func start(ctx context.Context, env []string, stderr io.Writer, bin string, args ...string) (*process, error) {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = io.Discard, stderr
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stop asks the process to end and waits for it; it may be called twice.
func (p *process) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// cpu returns the CPU time the process has used, user and system.
func (p *process) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses:
	// utime and stime are the 12th and 13th, in clock ticks.
	_, rest, _ := bytes.Cut(b, []byte(") "))
	f := strings.Fields(string(rest))
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is the kernel's USER_HZ, the unit of /proc/PID/stat times:
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// memory returns the process's peak and current resident sizes in MB
// (10^6 bytes).
func (p *process) memory() (hwm, rss float64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return math.NaN(), math.NaN()
	}
	for line := range strings.Lines(string(b)) {
		name, value, _ := strings.Cut(line, ":")
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
		if err != nil {
			continue
		}
		switch name {
		case "VmHWM":
			hwm = kb * 1024 / 1e6
		case "VmRSS":
			rss = kb * 1024 / 1e6
		}
	}
	return hwm, rss
}

// startProxy starts ratecord proxy in front of the upstream, with a global
// limit above any rate reached, logging every request to logPath.
func startProxy(ctx context.Context, cfg config, logPath string) (*process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	log, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	args := append([]string{"proxy", "-addr", addr, "-upstream", cfg.upstream, "-global-limit", "1000000"}, cfg.proxyArgs...)
	p, err := start(ctx, cfg.env, log, cfg.proxyBin, args...)
	if err != nil {
		return nil, err
	}
	p.url = "http://" + addr
	if err := waitHealthy(ctx, p.url+"/healthz"); err != nil {
		p.stop()
		return nil, fmt.Errorf("proxy: %w", err)
	}
	return p, nil
}

func build(ctx context.Context, dir, pkg, out string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, pkg)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build %s in %s: %w", pkg, dir, err)
	}
	return nil
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func waitHealthy(ctx context.Context, url string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not answering: %w", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func span(v []float64, format string) string {
	return fmt.Sprintf(format+"–"+format, slices.Min(v), slices.Max(v))
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func splitList(s, sep string) []string {
	var out []string
	for part := range strings.SplitSeq(s, sep) {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
