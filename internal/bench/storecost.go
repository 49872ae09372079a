package bench

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// StoreStats is a reading of the counters of a shared store's server
// (Redis), cumulative since the server started; a cluster's masters are
// added up.
type StoreStats struct {
	// CPU is the CPU time the server has used: used_cpu_sys plus
	// used_cpu_user of INFO cpu, every thread of the server.
	CPU time.Duration
	// Calls is the number of commands the server has executed: the calls
	// of every command in INFO commandstats, the commands Lua scripts run
	// included, except INFO itself (see [parseInfo]).
	Calls int64
}

// StoreProbe reads the counters of a shared store's server. Read sends
// nothing but INFO. A probe is used by one goroutine at a time.
type StoreProbe interface {
	Read(ctx context.Context) (StoreStats, error)
	Close() error
}

// idleSpan is how long the server's idle rate is measured, once per call
// of [Run], before the first run.
const idleSpan = time.Second

// parseInfo reads the CPU time and the executed commands from the text of
// INFO with its cpu and commandstats sections.
//
// Calls leaves out the calls of INFO: only the measurement sends INFO (one
// per server for each reading), never the store. The probe's connections
// are opened, and greeted with HELLO and CLIENT SETINFO, before its first
// reading and send nothing else, so nothing else of the measurement's own
// is in the figure. The handshakes of the workers' connections are in it:
// they are what the deployment costs Redis.
func parseInfo(info string) (StoreStats, error) {
	var st StoreStats
	var sys, user, cmds bool
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case k == "used_cpu_sys" || k == "used_cpu_user":
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				return StoreStats{}, fmt.Errorf("INFO cpu %s: %q is not a number of seconds", k, v)
			}
			st.CPU += time.Duration(f * float64(time.Second))
			sys, user = sys || k == "used_cpu_sys", user || k == "used_cpu_user"
		case strings.HasPrefix(k, "cmdstat_"):
			cmds = true
			if k == "cmdstat_info" {
				continue
			}
			n, err := commandCalls(v)
			if err != nil {
				return StoreStats{}, fmt.Errorf("INFO commandstats %s: %w", k, err)
			}
			st.Calls += n
		}
	}
	if !sys || !user {
		return StoreStats{}, errors.New("INFO cpu: no used_cpu_sys and used_cpu_user")
	}
	if !cmds {
		// A server that has run nothing but this INFO lists it; one
		// that lists nothing did not send the section.
		return StoreStats{}, errors.New("INFO commandstats: no cmdstat_ line")
	}
	return st, nil
}

// commandCalls returns the calls field of a line of INFO commandstats,
// "calls=12,usec=34,...".
func commandCalls(fields string) (int64, error) {
	for _, f := range strings.Split(fields, ",") {
		if v, ok := strings.CutPrefix(f, "calls="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("calls=%q is not a count", v)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("no calls= in %q", fields)
}

// storeDelta returns what the server did between readings a and b, span
// apart: its CPU time, the share of it an idle server uses in span at
// idle CPU time per second, and the commands it executed. ok is false when
// a counter went back (the server restarted).
func storeDelta(a, b StoreStats, span, idle time.Duration) (cpu, idleCPU time.Duration, calls int64, ok bool) {
	if b.CPU < a.CPU || b.Calls < a.Calls || span <= 0 {
		return 0, 0, 0, false
	}
	return b.CPU - a.CPU, time.Duration(float64(idle) * span.Seconds()), b.Calls - a.Calls, true
}

// idleRate returns the CPU time per second of wall time a server used
// between readings a and b, span apart, with no load.
func idleRate(a, b StoreStats, span time.Duration) time.Duration {
	if b.CPU < a.CPU || span <= 0 {
		return 0
	}
	return time.Duration(float64(b.CPU-a.CPU) / span.Seconds())
}

// storeCost computes r's figures per 2xx from its totals: StoreCommands
// (sent), StoreExecuted, StoreCPU less StoreIdleCPU (the load's share of
// the server's CPU), StoreSeconds and All2xx. Runs add up their totals
// before it is called, so a row's figures are those of all its runs
// together.
func (r *Result) storeCost() {
	r.StoreSentPer2xx, r.StoreExecPer2xx, r.StoreCPUPer2xx, r.StoreCPUPerSecond, r.Store2xxPerCore = 0, 0, 0, 0, 0
	if r.All2xx > 0 && r.StoreCommands > 0 {
		r.StoreSentPer2xx = float64(r.StoreCommands) / float64(r.All2xx)
	}
	if r.StoreSeconds <= 0 {
		return
	}
	load := max(r.StoreCPU-r.StoreIdleCPU, 0)
	r.StoreCPUPerSecond = float64(load) / float64(time.Millisecond) / r.StoreSeconds
	if r.All2xx > 0 {
		r.StoreExecPer2xx = float64(r.StoreExecuted) / float64(r.All2xx)
		r.StoreCPUPer2xx = float64(load) / float64(time.Microsecond) / float64(r.All2xx)
	}
	if load > 0 {
		// 2xx per second / CPU seconds per second, over the same span.
		r.Store2xxPerCore = float64(r.All2xx) / load.Seconds()
	}
}

// redisProbe reads INFO from every server of a Redis deployment, each
// through a client of its own with one connection.
type redisProbe struct {
	clients []*redis.Client
}

// Probe opens a probe of the server, or of every master of the cluster; it
// is the [Limiter].Probe of every limiter whose state is in this Redis.
// Its connections are made, and greeted, here: a reading sends nothing but
// INFO.
func (rc RedisConfig) Probe(ctx context.Context) (StoreProbe, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	addrs := []string{rc.Addr}
	if len(rc.Cluster) > 0 {
		cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: rc.Cluster})
		var mu sync.Mutex
		addrs = nil
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			addrs = append(addrs, c.Options().Addr)
			mu.Unlock()
			return nil
		})
		cc.Close()
		if err != nil {
			return nil, err
		}
	}
	p := &redisProbe{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 1, MaxIdleConns: 1, ConnMaxIdleTime: -1})
		p.clients = append(p.clients, c)
		if err := c.Ping(ctx).Err(); err != nil {
			p.Close()
			return nil, fmt.Errorf("probe %s: %w", a, err)
		}
	}
	return p, nil
}

// Read returns the counters of the servers added up.
func (p *redisProbe) Read(ctx context.Context) (StoreStats, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	var total StoreStats
	for _, c := range p.clients {
		info, err := c.Info(ctx, "cpu", "commandstats").Result()
		if err != nil {
			return StoreStats{}, err
		}
		st, err := parseInfo(info)
		if err != nil {
			return StoreStats{}, fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		total.CPU += st.CPU
		total.Calls += st.Calls
	}
	return total, nil
}

// Close closes the probe's clients.
func (p *redisProbe) Close() error {
	var errs []error
	for _, c := range p.clients {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
