package discordtest

import (
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
