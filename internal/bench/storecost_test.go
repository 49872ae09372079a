package bench

import (
	"bytes"
	"math"
	"strings"
	"testing"
	"time"
)

// infoText is INFO cpu commandstats as Redis 7 writes it, with \r\n.
func infoText(lines ...string) string {
	return "# CPU\r\n" + strings.Join(lines, "\r\n") + "\r\n"
}

func TestParseInfo(t *testing.T) {
	t.Parallel()
	cpu := []string{"used_cpu_sys:1.250000", "used_cpu_user:0.750000", "used_cpu_sys_children:9.000000",
		"used_cpu_user_children:9.000000", "used_cpu_sys_main_thread:1.000000", "used_cpu_user_main_thread:0.500000"}
	tests := []struct {
		name    string
		info    string
		want    StoreStats
		wantErr bool
	}{
		{
			name: "script calls and the commands they run add up; INFO does not",
			info: infoText(append(append([]string{}, cpu...), "", "# Commandstats",
				"cmdstat_evalsha:calls=100,usec=900,usec_per_call=9.00,rejected_calls=0,failed_calls=0",
				"cmdstat_hget:calls=250,usec=100,usec_per_call=0.40,rejected_calls=0,failed_calls=0",
				"cmdstat_client|setinfo:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0",
				"cmdstat_info:calls=7,usec=300,usec_per_call=42.86,rejected_calls=0,failed_calls=0")...),
			want: StoreStats{CPU: 2 * time.Second, Calls: 352},
		},
		{
			name: "a server that ran only INFO",
			info: infoText(append(append([]string{}, cpu...), "# Commandstats",
				"cmdstat_info:calls=1,usec=51,usec_per_call=51.00,rejected_calls=0,failed_calls=0")...),
			want: StoreStats{CPU: 2 * time.Second},
		},
		{
			name:    "no commandstats section",
			info:    infoText(cpu...),
			wantErr: true,
		},
		{
			name:    "no cpu section",
			info:    "# Commandstats\r\ncmdstat_get:calls=1,usec=1\r\n",
			wantErr: true,
		},
		{
			name:    "a cpu figure that is no number",
			info:    infoText("used_cpu_sys:x", "used_cpu_user:1", "cmdstat_get:calls=1"),
			wantErr: true,
		},
		{
			name:    "a calls figure that is no count",
			info:    infoText("used_cpu_sys:1", "used_cpu_user:1", "cmdstat_get:calls=-3,usec=1"),
			wantErr: true,
		},
		{
			name:    "a command line without calls",
			info:    infoText("used_cpu_sys:1", "used_cpu_user:1", "cmdstat_get:usec=1"),
			wantErr: true,
		},
		{
			name:    "empty",
			info:    "",
			wantErr: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseInfo(tt.info)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("parseInfo(%q) = %+v, %v; want %+v, error %v", tt.info, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestStoreDelta(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	a := StoreStats{CPU: 100 * ms, Calls: 1000}
	tests := []struct {
		name      string
		b         StoreStats
		span      time.Duration
		idle      time.Duration
		cpu, rest time.Duration
		calls     int64
		ok        bool
	}{
		{"a run of 2 s at 4 ms/s idle", StoreStats{CPU: 180 * ms, Calls: 4000}, 2 * time.Second, 4 * ms, 80 * ms, 8 * ms, 3000, true},
		{"no idle rate", StoreStats{CPU: 101 * ms, Calls: 1001}, time.Second, 0, ms, 0, 1, true},
		{"the server restarted", StoreStats{CPU: 10 * ms, Calls: 5}, time.Second, 0, 0, 0, 0, false},
		{"no span", StoreStats{CPU: 200 * ms, Calls: 2000}, 0, 0, 0, 0, 0, false},
	}
	for _, tt := range tests {
		cpu, idle, calls, ok := storeDelta(a, tt.b, tt.span, tt.idle)
		if cpu != tt.cpu || idle != tt.rest || calls != tt.calls || ok != tt.ok {
			t.Errorf("%s: storeDelta(%+v, %+v, %v, %v) = %v, %v, %d, %v; want %v, %v, %d, %v",
				tt.name, a, tt.b, tt.span, tt.idle, cpu, idle, calls, ok, tt.cpu, tt.rest, tt.calls, tt.ok)
		}
	}
	if got := idleRate(a, StoreStats{CPU: 106 * ms}, 1500*ms); got != 4*ms {
		t.Errorf("idleRate(6 ms in 1.5 s) = %v; want 4ms", got)
	}
	if got := idleRate(a, StoreStats{CPU: 50 * ms}, time.Second); got != 0 {
		t.Errorf("idleRate(CPU went back) = %v; want 0", got)
	}
}

func TestStoreCost(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		name string
		in   Result
		// sent, exec, µs per 2xx, ms/s, 2xx/s per core
		want [5]float64
	}{
		{
			// 2 s, 100 2xx; 60 ms of CPU of which 10 ms idle: 50 ms for
			// the load, 500 µs per 2xx, 25 ms/s, and 50 2xx/s on 0.025
			// cores is 2,000 2xx/s on a core.
			name: "a run",
			in:   Result{All2xx: 100, StoreCommands: 300, StoreExecuted: 2000, StoreCPU: 60 * ms, StoreIdleCPU: 10 * ms, StoreSeconds: 2},
			want: [5]float64{3, 20, 500, 25, 2000},
		},
		{
			name: "idle share larger than the CPU used: nothing left for the load",
			in:   Result{All2xx: 10, StoreCommands: 5, StoreExecuted: 7, StoreCPU: 3 * ms, StoreIdleCPU: 4 * ms, StoreSeconds: 1},
			want: [5]float64{0.5, 0.7, 0, 0, 0},
		},
		{
			name: "no 2xx",
			in:   Result{StoreCommands: 50, StoreExecuted: 70, StoreCPU: 30 * ms, StoreSeconds: 3},
			want: [5]float64{0, 0, 0, 10, 0},
		},
		{
			name: "hook counted, server not read",
			in:   Result{All2xx: 4, StoreCommands: 10},
			want: [5]float64{2.5, 0, 0, 0, 0},
		},
	}
	for _, tt := range tests {
		r := tt.in
		r.storeCost()
		got := [5]float64{r.StoreSentPer2xx, r.StoreExecPer2xx, r.StoreCPUPer2xx, r.StoreCPUPerSecond, r.Store2xxPerCore}
		for i := range got {
			if math.Abs(got[i]-tt.want[i]) > 1e-9*max(1, tt.want[i]) {
				t.Errorf("%s: storeCost = %v; want %v", tt.name, got, tt.want)
				break
			}
		}
	}
}

// TestStoreCostOfRows checks that a row of several runs divides the sums
// of their totals, not the mean of their ratios, and that the table shows
// the figures.
func TestStoreCostOfRows(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	run := func(n int, cpu time.Duration, all2xx int) Result {
		r := Result{Scenario: "fan-out", Limiter: NameRedis, Run: n, Procs: 4, All2xx: all2xx, StoreCommands: int64(2 * all2xx),
			StoreExecuted: int64(10 * all2xx), StoreCPU: cpu, StoreIdleCPU: 4 * ms, StoreSeconds: 1, StoreIdleRate: 4,
			LateP50: math.NaN(), LateP99: math.NaN(), OverP50: math.NaN(), OverP99: math.NaN(), OverMax: math.NaN()}
		r.storeCost()
		return r
	}
	// 104 ms for 100 2xx, then 24 ms for 300: 120 ms of load for 400 2xx.
	rows := Aggregate([]Result{run(1, 104*ms, 100), run(2, 24*ms, 300)})
	r := rows[0].Result
	if r.All2xx != 400 || r.StoreSentPer2xx != 2 || r.StoreExecPer2xx != 10 || math.Abs(r.StoreCPUPer2xx-300) > 1e-9 ||
		math.Abs(r.StoreCPUPerSecond-60) > 1e-9 || math.Abs(r.Store2xxPerCore-400/0.12) > 1e-6 {
		t.Errorf("row = %d 2xx, %v sent, %v executed, %v µs, %v ms/s, %v per core; want 400, 2, 10, 300, 60, %v",
			r.All2xx, r.StoreSentPer2xx, r.StoreExecPer2xx, r.StoreCPUPer2xx, r.StoreCPUPerSecond, r.Store2xxPerCore, 400/0.12)
	}
	var table bytes.Buffer
	PrintTable(&table, rows)
	for _, want := range []string{"exec/2xx", "2xx/s/core", "300.0", "3333"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
}
