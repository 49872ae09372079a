package discordtest

import (
	"net/http"
	"testing"
	"time"
)

// TestStoppedProcessReadsOnContinue checks the judge's view of a process
// the client stopped: a response that reached it while stopped tells it,
// and the client's other processes, nothing until it continues, and then
// counts from the continue.
func TestStoppedProcessReadsOnContinue(t *testing.T) {
	s, err := newServer(nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := startTime()
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	frozen := process{ip: "127.0.0.1", name: "2"}
	other := process{ip: "127.0.0.1", name: "0"}
	at := func(n int) reached { return reached{at: ms(n), by: frozen, written: true} }
	sent := func(p process, n int) *request { return &request{sent: ms(n), process: p} }

	if !s.knew(at(100), sent(other, 110)) {
		t.Fatal("before any stop: a response 10 ms old was not known to another process")
	}
	type knewCase struct {
		what string
		r    reached
		q    *request
		want bool
	}
	check := func(cases []knewCase) {
		t.Helper()
		for _, c := range cases {
			if got := s.knew(c.r, c.q); got != c.want {
				t.Errorf("%s: knew = %v; want %v", c.what, got, c.want)
			}
		}
	}

	s.Stopped("2", ms(50))
	check([]knewCase{
		{"reached before the stop, another process 10 ms later", at(40), sent(other, 60), true},
		{"reached while stopped, another process 500 ms later, still stopped", at(100), sent(other, 600), false},
		{"reached while stopped, the stopped process itself", at(100), sent(frozen, 600), false},
	})

	s.Continued("2", ms(700))
	s.Stopped("2", ms(650)) // dated before the continue: ignored
	check([]knewCase{
		{"reached while stopped, another process within the allowance of the continue", at(100), sent(other, 703), false},
		{"reached while stopped, another process past the allowance of the continue", at(100), sent(other, 706), true},
		{"reached while stopped, the process itself within its reaction time", at(100), sent(frozen, 700), false},
		{"reached while stopped, the process itself after its reaction time", at(100), sent(frozen, 702), true},
		{"reached after the continue", at(800), sent(other, 810), true},
	})

	// A process of another IP with the same name is stopped by name too; a
	// process never stopped is not.
	if s.knew(reached{at: ms(100), by: process{ip: "10.0.0.1", name: "2"}, written: true}, sent(other, 600)) {
		t.Error("the stop did not apply to the name from another IP")
	}
	if !s.knew(reached{at: ms(100), by: other, written: true}, sent(frozen, 600)) {
		t.Error("a process never stopped was taken as stopped")
	}

	// The spans remembered per process are bounded.
	for i := range 2 * maxStops {
		s.Stopped("3", ms(1000+10*i))
		s.Continued("3", ms(1005+10*i))
	}
	if n := len(s.stops["3"]); n != maxStops {
		t.Errorf("%d stops remembered; want %d", n, maxStops)
	}
}

// TestFrozenInFlight checks the judge of a request frozen in flight: one
// whose SentHeader dates it before its process stopped, that reaches the
// emulator after the process continued. It is judged by its hand-off, its
// own 429 and those of the windows it filled are unavoidable, and a lead
// the stop does not explain is not forgiven.
func TestFrozenInFlight(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	const messages = "/api/v10/channels/1/messages"
	type send struct {
		proc     string
		at       time.Duration // when the handler begins, from the start
		sentAt   time.Duration // the SentHeader, -1 for none
		status   int
		frozen   bool
		avoid    bool
		scope    string
		describe string
	}
	tests := []struct {
		name       string
		opts       []Option         // WithGlobalLimit(2) when nil
		stop       [2]time.Duration // worker-2 stopped over this span; zero for none
		sends      []send
		wantFrozen int
	}{
		{
			name: "frozen request refused by the global limit",
			stop: [2]time.Duration{11 * ms, 600 * ms},
			sends: []send{
				{"1", 0, 0, 200, false, false, "", "fills half the window"},
				{"1", 100 * ms, 100 * ms, 200, false, false, "", "fills the window"},
				{"2", 605 * ms, 10 * ms, 429, true, false, "global", "handed off before its stop"},
			},
			wantFrozen: 1,
		},
		{
			name: "window filled by a frozen request",
			stop: [2]time.Duration{11 * ms, 600 * ms},
			sends: []send{
				{"1", 0, 0, 200, false, false, "", ""},
				{"2", 605 * ms, 10 * ms, 200, true, false, "", "handed off before its stop, fits"},
				{"1", 610 * ms, 610 * ms, 429, false, false, "global", "would have fitted without the frozen one"},
				{"1", 1010 * ms, 1010 * ms, 200, false, false, "", "the first left the window"},
				{"1", 1020 * ms, 1020 * ms, 429, false, false, "global", "full with one frozen request in it"},
				{"1", 1700 * ms, 1700 * ms, 200, false, false, "", "the frozen one left the window"},
				{"1", 1710 * ms, 1710 * ms, 429, false, true, "global", "full of the client's own"},
			},
			wantFrozen: 1,
		},
		{
			name: "bucket window filled by a frozen request",
			opts: []Option{WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 2, Window: time.Second, Fixed: true})},
			stop: [2]time.Duration{11 * ms, 600 * ms},
			sends: []send{
				{"1", 0, 0, 200, false, false, "", "opens the window"},
				{"2", 605 * ms, 10 * ms, 200, true, false, "", "handed off before its stop, fits"},
				{"1", 610 * ms, 610 * ms, 429, false, false, "user", "would have fitted without the frozen one"},
				{"1", 1010 * ms, 1010 * ms, 200, false, false, "", "a new window"},
				{"1", 1020 * ms, 1020 * ms, 200, false, false, "", ""},
				{"1", 1030 * ms, 1030 * ms, 429, false, true, "user", "the new window is the client's own"},
			},
			wantFrozen: 1,
		},
		{
			name: "no stop",
			sends: []send{
				{"1", 0, 0, 200, false, false, "", ""},
				{"2", 605 * ms, 10 * ms, 200, false, false, "", "an old SentHeader without a stop: dated at the handler"},
				{"1", 610 * ms, 610 * ms, 429, false, true, "global", "the window is the client's own"},
			},
		},
		{
			name: "a stop shorter than the lead",
			stop: [2]time.Duration{11 * ms, 200 * ms},
			sends: []send{
				{"1", 0, 0, 200, false, false, "", ""},
				{"1", 100 * ms, 100 * ms, 200, false, false, "", ""},
				{"2", 605 * ms, 10 * ms, 429, false, true, "global", "400 ms of its lead unexplained"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			opts := tt.opts
			if opts == nil {
				opts = []Option{WithGlobalLimit(2)}
			}
			h := newHarness(t, opts...)
			t0 := h.clock.Now()
			stopped := tt.stop[1] == 0
			for i, sd := range tt.sends {
				if !stopped && t0.Add(sd.at).After(t0.Add(tt.stop[1])) {
					h.srv.Stopped("2", t0.Add(tt.stop[0]))
					h.srv.Continued("2", t0.Add(tt.stop[1]))
					stopped = true
				}
				h.clock.Advance(t0.Add(sd.at).Sub(h.clock.Now()))
				extra := http.Header{}
				if sd.sentAt >= 0 {
					extra.Set(SentHeader, stamp(t0.Add(sd.sentAt)))
				}
				h.doWith(sd.proc, extra, "POST", messages, botA, `{}`).want(t, sd.status)
				e := h.srv.Stats().Log[i]
				if e.Frozen != sd.frozen || e.Avoidable != sd.avoid || e.Scope != sd.scope {
					t.Errorf("request %d (%s): frozen %v, avoidable %v, scope %q; want %v, %v, %q",
						i, sd.describe, e.Frozen, e.Avoidable, e.Scope, sd.frozen, sd.avoid, sd.scope)
				}
			}
			if st := h.srv.Stats(); st.Frozen != tt.wantFrozen {
				t.Errorf("Stats.Frozen = %d; want %d", st.Frozen, tt.wantFrozen)
			}
		})
	}
}
