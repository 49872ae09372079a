package bench

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// TestThroughputScenarios: every scenario of the set is known by name, has
// an emulator configuration that starts and a positive maximum.
func TestThroughputScenarios(t *testing.T) {
	t.Parallel()
	n := discordtest.DiscordNetwork()
	for _, name := range []string{"retry-after", "html-429", "shared-resources", "cancel-inflight", "overstated",
		"edge-below", "deadline-short", "probe-sliding"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			scs, err := pick(n, name)
			if err != nil || len(scs) != 1 {
				t.Fatalf("pick(%q) = %d scenarios, %v; want one", name, len(scs), err)
			}
			sc := scs[0]
			if sc.Load == nil || sc.Max == nil {
				t.Fatalf("%s has no load or no maximum", name)
			}
			for _, first := range []time.Duration{0, 150 * time.Millisecond} {
				if m := sc.Max(first, 4*time.Second); m <= 0 {
					t.Errorf("Max(%v, 4s) = %v; want it positive", first, m)
				}
			}
			srv, err := discordtest.Start(sc.Emulator...)
			if err != nil {
				t.Fatalf("the emulator of %s does not start: %v", name, err)
			}
			srv.Close()
		})
	}
	if got := len(Throughput(n)); got != 8 {
		t.Errorf("Throughput has %d scenarios; want 8", got)
	}
}

func TestBareLate(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	t0 := time.Unix(0, 0)
	entry := func(at time.Duration, major string, bare bool, reached time.Duration) discordtest.LogEntry {
		e := discordtest.LogEntry{Time: t0.Add(at), Route: "POST /channels/{channel_id}/messages", Credential: "c", Major: major, Status: 200}
		if bare {
			e.Status, e.Bare, e.RetryAfter, e.Reached = 429, true, time.Second, t0.Add(reached)
		}
		return e
	}
	log := []discordtest.LogEntry{
		entry(0, "channels/1", false, 0),
		entry(10*ms, "channels/1", true, 40*ms),   // the wait runs out at 1040 ms
		entry(20*ms, "channels/1", true, 60*ms),   // at 1060 ms: the later counts
		entry(500*ms, "channels/1", true, 530*ms), // sent early, refused again: at 1530 ms
		entry(600*ms, "channels/2", false, 0),     // another channel
		entry(1580*ms, "channels/1", false, 0),    // the retry, 50 ms late
		entry(1590*ms, "channels/1", false, 0),    // not a retry
		entry(1600*ms, "channels/2", true, 1620*ms),
		entry(2700*ms, "channels/2", false, 0), // 80 ms late
	}
	got := bareLate(log)
	if len(got) != 2 || !(got[0] == 50*ms && got[1] == 80*ms || got[0] == 80*ms && got[1] == 50*ms) {
		t.Errorf("bareLate = %v; want 50ms and 80ms", got)
	}
}

func TestCancelAfterSend(t *testing.T) {
	t.Parallel()
	env := &Env{rec: &recorder{}}
	// The request waits for its context, as one in flight does.
	tr := &processTransport{worker: "0", next: roundTripFunc(func(r *http.Request) (*http.Response, error) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	})}
	ctx, canceled := env.CancelAfterSend(t.Context(), time.Millisecond)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://127.0.0.1/api/v10/channels/1/messages", nil)
	if _, err := tr.RoundTrip(req); !errors.Is(err, context.Canceled) {
		t.Errorf("RoundTrip = %v; want the request canceled after it left", err)
	}
	if !canceled() {
		t.Error("canceled() = false after the timer canceled the request")
	}

	// A context whose request never leaves is never canceled.
	ctx, canceled = env.CancelAfterSend(t.Context(), time.Millisecond)
	time.Sleep(5 * time.Millisecond)
	if ctx.Err() != nil || canceled() {
		t.Error("a request that never left was canceled")
	}
}

// TestThroughputRuns runs retry-after and cancel-inflight end to end with
// ratecord, asserting only what holds on any machine: retry-after gets
// bare 429s, as nothing announces its limit; cancel-inflight, on a network
// whose way up takes longer than its callers wait, has requests canceled
// in flight that still arrive, and the Transport reads their responses
// without their callers (only a response still on its way when the run
// ends and the Transport closes may be lost).
func TestThroughputRuns(t *testing.T) {
	t.Parallel()
	slow := discordtest.Network{Up: discordtest.Leg{Base: 40 * time.Millisecond}, Down: discordtest.Leg{Base: 40 * time.Millisecond}}
	for _, c := range []struct {
		name    string
		network discordtest.Network
	}{
		{"retry-after", discordtest.LANNetwork()},
		{"cancel-inflight", slow},
	} {
		scs, err := pick(c.network, c.name)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := Run(t.Context(), scs, []Limiter{Ratecord()}, Options{Duration: 1500 * time.Millisecond, Network: c.network})
		if err != nil {
			t.Fatal(err)
		}
		r := rs[0]
		if r.Successes == 0 || r.MaxPerSecond <= 0 {
			t.Errorf("%s: %d successes, max %v/s; want successes against a maximum", c.name, r.Successes, r.MaxPerSecond)
		}
		switch c.name {
		case "retry-after":
			if r.Bare == 0 || r.Avoidable+r.Unavoidable < r.Bare {
				t.Errorf("retry-after: %d bare 429s, %d avoidable, %d unavoidable; want bare 429s, each judged", r.Bare, r.Avoidable, r.Unavoidable)
			}
		case "cancel-inflight":
			if r.Canceled == 0 || r.Lost >= r.Canceled || r.Calls <= r.Canceled {
				t.Errorf("cancel-inflight: %d of %d calls canceled, %d responses lost; want some canceled, their responses read", r.Canceled, r.Calls, r.Lost)
			}
		}
	}
}
