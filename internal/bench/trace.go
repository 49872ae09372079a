package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// Attempt is one request as the worker that sent it saw it, recorded with
// -trace-avoidable: which worker, what, when it left for the emulator,
// when its answer came back and what the answer was.
type Attempt struct {
	Part   int       `json:"part"`
	Method string    `json:"method"`
	Path   string    `json:"path"`
	Sent   time.Time `json:"sent"`
	Got    time.Time `json:"got"`
	Status int       `json:"status"`
	Scope  string    `json:"scope,omitempty"`
}

// StoreEvent is a message a worker's store logged, recorded with
// -trace-avoidable: a switch to or from its local limiter, or a report it
// dropped.
type StoreEvent struct {
	Part int       `json:"part"`
	At   time.Time `json:"at"`
	Msg  string    `json:"msg"`
}

// eventHandler is a slog.Handler that records every message as a
// StoreEvent of part, its attributes appended.
type eventHandler struct {
	rec   *recorder
	part  int
	attrs []slog.Attr
}

func (h *eventHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *eventHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool {
		fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	h.rec.mu.Lock()
	h.rec.events = append(h.rec.events, StoreEvent{Part: h.part, At: r.Time, Msg: b.String()})
	h.rec.mu.Unlock()
	return nil
}

func (h *eventHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &eventHandler{rec: h.rec, part: h.part, attrs: append(slices.Clip(h.attrs), as...)}
}

func (h *eventHandler) WithGroup(string) slog.Handler { return h }

type traceKey struct{}

// withTrace returns ctx telling the runs under it to record every attempt.
func withTrace(ctx context.Context) context.Context { return context.WithValue(ctx, traceKey{}, true) }

func tracing(ctx context.Context) bool { b, _ := ctx.Value(traceKey{}).(bool); return b }

// record adds an attempt.
func (r *recorder) record(a Attempt) {
	r.mu.Lock()
	r.attempts = append(r.attempts, a)
	r.mu.Unlock()
}

// traceRun is the first line -trace-avoidable writes for a run: the faults
// it had, times in milliseconds from the run's start.
type traceRun struct {
	Type     string        `json:"type"` // "run"
	Scenario string        `json:"scenario"`
	Limiter  string        `json:"limiter"`
	Run      int           `json:"run"`
	Start    time.Time     `json:"start"`
	Seconds  float64       `json:"seconds"`
	Freezes  []traceFreeze `json:"freezes,omitempty"`
	// RedisKilled and RedisBack are when the run's Redis was killed and
	// answered again (-redis-restart).
	RedisKilled float64 `json:"redis_killed_ms,omitempty"`
	RedisBack   float64 `json:"redis_back_ms,omitempty"`
	Avoidable   int     `json:"avoidable_429"`
	// Errors counts the run's client errors by kind ([errorKind]).
	Errors map[string]int `json:"errors,omitempty"`
	// Events are what the workers' stores logged.
	Events []traceEvent `json:"store_events,omitempty"`
}

type traceEvent struct {
	Part int     `json:"part"`
	At   float64 `json:"at_ms"`
	Msg  string  `json:"msg"`
}

type traceFreeze struct {
	Part   int     `json:"part"`
	At     float64 `json:"at_ms"`
	Length float64 `json:"length_ms"`
}

// trace429 is a line of -trace-avoidable per avoidable 429: the emulator's
// entry, the attempt it was, as far as one matches, and the faults around
// it. Times are in milliseconds from the run's start; Part is -1 when no
// attempt matches.
type trace429 struct {
	Type       string  `json:"type"` // "429"
	Scenario   string  `json:"scenario"`
	Limiter    string  `json:"limiter"`
	Run        int     `json:"run"`
	At         float64 `json:"arrived_ms"`
	Route      string  `json:"route"`
	Major      string  `json:"major,omitempty"`
	Scope      string  `json:"scope"`
	RetryAfter float64 `json:"retry_after_ms"`
	Part       int     `json:"part"`
	// Candidates counts the attempts the entry could have been; the one
	// whose answer came back closest to when the emulator's reached the
	// client is taken. Attempts answered 429 are taken first; failing
	// those, attempts whose sender got no answer (NoAnswer: it gave up, at
	// the end of the run for one), whose Got is when it gave up.
	Candidates int     `json:"candidates"`
	NoAnswer   bool    `json:"no_answer,omitempty"`
	Sent       float64 `json:"sent_ms,omitempty"`
	Got        float64 `json:"got_ms,omitempty"`
	Path       string  `json:"path,omitempty"`
	// SinceWake is how long before the attempt left its process had been
	// continued after its last freeze, FrozenFor how long that freeze
	// lasted; both absent when the process had not been frozen.
	SinceWake float64 `json:"since_wake_ms,omitempty"`
	FrozenFor float64 `json:"frozen_for_ms,omitempty"`
	// Burst counts the attempts its process sent from its wake to 20 ms
	// after it; FrozenInFlight reports a freeze of the process between the
	// attempt's sending and its answer.
	Burst          int  `json:"sent_within_20ms_of_wake,omitempty"`
	FrozenInFlight bool `json:"frozen_in_flight,omitempty"`
	// Event is the last message its process's store logged before the
	// attempt left, and SinceEvent how long before.
	Event      string  `json:"sender_store_event,omitempty"`
	SinceEvent float64 `json:"since_store_event_ms,omitempty"`
	// Woken lists the other processes frozen at some point in the second
	// before the entry arrived.
	Woken []traceWoken `json:"others_frozen_in_prior_second,omitempty"`
}

// traceWoken is another process's freeze near an avoidable 429.
type traceWoken struct {
	Part int `json:"part"`
	// Before is how long before the entry arrived the process was
	// continued, negative when it was continued after.
	Before    float64 `json:"woke_ms_before"`
	FrozenFor float64 `json:"frozen_for_ms"`
	// Burst counts the attempts it sent from its wake to 20 ms after.
	Burst int `json:"sent_within_20ms_of_wake"`
}

// burstSpan is how soon after a wake an attempt counts in trace429.Burst.
const burstSpan = 20 * time.Millisecond

// traced is what a run recorded for -trace-avoidable.
type traced struct {
	attempts []Attempt
	errKinds map[string]int
	events   []StoreEvent
	freezes  []Freeze
	outage   outageRecord
}

// writeTrace writes the lines of -trace-avoidable for one run: its faults,
// then each avoidable 429 with the attempt it matches.
func writeTrace(w io.Writer, r Result, start time.Time, log []discordtest.LogEntry, tr traced) error {
	ms := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return float64(t.Sub(start)) / float64(time.Millisecond)
	}
	run := traceRun{Type: "run", Scenario: r.Scenario, Limiter: r.Limiter, Run: r.Run, Start: start, Seconds: r.Seconds + r.Warmup,
		RedisKilled: ms(tr.outage.Killed), RedisBack: ms(tr.outage.Back), Avoidable: r.Avoidable, Errors: tr.errKinds}
	for _, f := range tr.freezes {
		run.Freezes = append(run.Freezes, traceFreeze{Part: f.Part, At: ms(f.Start), Length: float64(f.Length) / float64(time.Millisecond)})
	}
	for _, e := range tr.events {
		run.Events = append(run.Events, traceEvent{Part: e.Part, At: ms(e.At), Msg: e.Msg})
	}
	enc := json.NewEncoder(w)
	if err := enc.Encode(run); err != nil {
		return err
	}
	for _, t := range explain(r, start, log, tr) {
		if err := enc.Encode(t); err != nil {
			return err
		}
	}
	return nil
}

// explain matches each avoidable 429 of log with the attempt it was: an
// attempt on a path of the entry's route and major parameter, sent before
// the entry arrived and at most maxUp before, answered 429 with the same
// scope or, failing any, not answered; of those not matched yet, the one
// whose answer came back (or whose sender gave up) closest to when the
// emulator's answer reached the client.
func explain(r Result, start time.Time, log []discordtest.LogEntry, tr traced) []trace429 {
	attempts, freezes := tr.attempts, tr.freezes
	const maxUp = time.Second // far above any profile's way up, for a loaded machine
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	used := make([]bool, len(attempts))
	var out []trace429
	for _, e := range log {
		if !e.Avoidable || e.Status != 429 {
			continue
		}
		t := trace429{Type: "429", Scenario: r.Scenario, Limiter: r.Limiter, Run: r.Run, At: ms(e.Time.Sub(start)), Route: e.Route,
			Major: e.Major, Scope: e.Scope, RetryAfter: ms(e.RetryAfter), Part: -1}
		best, bestGap := -1, time.Duration(math.MaxInt64)
		for _, answered := range []bool{true, false} {
			for i, a := range attempts {
				if used[i] || a.Sent.After(e.Time) || e.Time.Sub(a.Sent) > maxUp || !onRoute(e.Route, e.Major, a.Method, a.Path) {
					continue
				}
				if answered && (a.Status != 429 || a.Scope != e.Scope) || !answered && a.Status != 0 {
					continue
				}
				t.Candidates++
				if gap := a.Got.Sub(e.Reached).Abs(); gap < bestGap {
					best, bestGap = i, gap
				}
			}
			if best >= 0 {
				t.NoAnswer = !answered
				break
			}
		}
		if best >= 0 {
			used[best] = true
			a := attempts[best]
			t.Part, t.Sent, t.Got, t.Path = a.Part, ms(a.Sent.Sub(start)), ms(a.Got.Sub(start)), a.Path
			if f, ok := lastWake(freezes, a.Part, a.Sent); ok {
				t.SinceWake, t.FrozenFor, t.Burst = ms(a.Sent.Sub(f.End())), ms(f.Length), burst(attempts, f)
			}
			for _, f := range freezes {
				if f.Part == a.Part && f.Start.Before(a.Got) && f.End().After(a.Sent) {
					t.FrozenInFlight = true
				}
			}
			for _, ev := range tr.events {
				if ev.Part == a.Part && !ev.At.After(a.Sent) && (t.Event == "" || a.Sent.Sub(ev.At) < time.Duration(t.SinceEvent*float64(time.Millisecond))) {
					t.Event, t.SinceEvent = ev.Msg, ms(a.Sent.Sub(ev.At))
				}
			}
		}
		for _, f := range freezes {
			if f.Part != t.Part && f.End().After(e.Time.Add(-time.Second)) && f.Start.Before(e.Time) {
				t.Woken = append(t.Woken, traceWoken{Part: f.Part, Before: ms(e.Time.Sub(f.End())), FrozenFor: ms(f.Length), Burst: burst(attempts, f)})
			}
		}
		out = append(out, t)
	}
	return out
}

// burst counts the attempts of f's process sent from the end of f to
// burstSpan after it.
func burst(attempts []Attempt, f Freeze) int {
	n := 0
	for _, a := range attempts {
		if a.Part == f.Part && !a.Sent.Before(f.End()) && a.Sent.Sub(f.End()) <= burstSpan {
			n++
		}
	}
	return n
}

// lastWake returns the last freeze of part that ended at or before t.
func lastWake(freezes []Freeze, part int, t time.Time) (Freeze, bool) {
	var last Freeze
	ok := false
	for _, f := range freezes {
		if f.Part == part && !f.End().After(t) && (!ok || f.End().After(last.End())) {
			last, ok = f, true
		}
	}
	return last, ok
}

// onRoute reports whether method and path (without the API prefix) are of
// route and major, a log entry's: the route "POST /channels/{channel_id}/messages",
// or for a route outside the emulator's table the method and path with
// tokens redacted; the major parameter, such as "channels/100", starts the
// path, tokens redacted.
func onRoute(route, major, method, path string) bool {
	m, tmpl, ok := strings.Cut(route, " ")
	if !ok || m != method {
		return false
	}
	ps := strings.Split(strings.Trim(path, "/"), "/")
	ts := strings.Split(strings.Trim(tmpl, "/"), "/")
	if len(ts) != len(ps) || !segmentsMatch(ts, ps) {
		return false
	}
	if major == "" {
		return true
	}
	ms := strings.Split(major, "/")
	return len(ms) <= len(ps) && segmentsMatch(ms, ps[:len(ms)])
}

// segmentsMatch reports whether the path segments ps are those of
// pattern, whose "{name}" and redacted segments match any.
func segmentsMatch(pattern, ps []string) bool {
	for i, s := range pattern {
		if s != ps[i] && !strings.HasPrefix(s, "{") && s != "REDACTED" {
			return false
		}
	}
	return true
}

// errorKind is an error's message, without the request's method and URL,
// with each run of digits replaced by one '#', for counting errors by
// kind.
func errorKind(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	var b strings.Builder
	digits := false
	for _, c := range err.Error() {
		d := c >= '0' && c <= '9'
		switch {
		case d && !digits:
			b.WriteByte('#')
		case !d:
			b.WriteRune(c)
		}
		digits = d
	}
	return b.String()
}

// maxErrorKinds bounds the kinds of error a trace counts; the rest count
// under "other".
const maxErrorKinds = 50

// traceError counts err by kind when the run is traced; r.mu must be
// held.
func (r *recorder) traceError(err error) {
	if r.tracing {
		r.addErrors(map[string]int{errorKind(err): 1})
	}
}

// addErrors adds counts of errors by kind; r.mu must be held.
func (r *recorder) addErrors(kinds map[string]int) {
	for k, n := range kinds {
		if _, ok := r.errKinds[k]; !ok && len(r.errKinds) >= maxErrorKinds {
			k = "other"
		}
		if r.errKinds == nil {
			r.errKinds = make(map[string]int)
		}
		r.errKinds[k] += n
	}
}
