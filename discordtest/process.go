package discordtest

import (
	"net/http"
	"strconv"
	"time"
)

// ProcessHeader is the request header with which a client names the process
// that sends a request, for a bot that runs as several processes sharing its
// limits (through Redis, say). The value is opaque: requests with the same
// value from the same client IP come from one process. Requests without the
// header belong to one unnamed process per client IP.
//
// The emulator reads it only to tell avoidable 429s apart (see [Stats] and
// [WithPropagation]); it never appears in a response or in the log of
// [Server.Stats].
const ProcessHeader = "X-Discordtest-Process"

// SentHeader is the request header with which a client on the emulator's
// host says when it handed the request to the network: the emulator's
// clock (the wall clock, unless the emulator runs on another) in Unix
// nanoseconds. The emulator then times the request's way up from that
// moment instead of from when its handler began, which a busy host can
// delay by milliseconds, and judges what the client knew at that moment
// (see [Stats]). A value after the handler began, more than maxSentLead
// before it, or unreadable is ignored. Like [ProcessHeader], it never
// appears in a response or the log.
const SentHeader = "X-Discordtest-Sent"

// maxSentLead is the most by which [SentHeader] may date a request before
// its handler began.
const maxSentLead = 100 * time.Millisecond

// sentAt returns when the request r, whose handler began at handled, was
// sent: its [SentHeader], if readable and within maxSentLead before
// handled, and handled otherwise. A header dated further back still counts
// when its process ([ProcessHeader]) was stopped (see [Server.Stopped])
// for all of the lead but maxSentLead: the request was frozen in flight,
// handed to the network before its process stopped and written after it
// continued, and frozen reports it.
func (s *Server) sentAt(r *http.Request, handled time.Time) (sent time.Time, frozen bool) {
	v := r.Header.Get(SentHeader)
	if v == "" {
		return handled, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return handled, false
	}
	t := time.Unix(0, n)
	if t.After(handled) {
		return handled, false
	}
	lead := handled.Sub(t)
	if lead <= maxSentLead {
		return t, false
	}
	s.mu.Lock()
	stopped := s.stoppedWithin(r.Header.Get(ProcessHeader), t, handled)
	s.mu.Unlock()
	if stopped > 0 && lead-stopped <= maxSentLead {
		return t, true
	}
	return handled, false
}

// stoppedWithin returns how long the process named name was stopped
// between from and to. s.mu must be held.
func (s *Server) stoppedWithin(name string, from, to time.Time) time.Duration {
	var total time.Duration
	for _, sp := range s.stops[name] {
		end := sp.to
		if end.IsZero() || end.After(to) {
			end = to
		}
		start := sp.from
		if start.Before(from) {
			start = from
		}
		if end.After(start) {
			total += end.Sub(start)
		}
	}
	return total
}

// reaction is how long a process is given to read a response before it can
// hold back requests it is about to send: a request sent within this long
// after the response reached its process was already on its way. It is not
// scaled: reading a response takes as long at any time scale.
const reaction = time.Millisecond

// defaultPropagation is how long a response that reached one process of a
// client may take to reach its other processes, unless [WithPropagation]
// says otherwise: Redis pub/sub takes 0.75–1.7 ms on the project's build
// machine, with room to spare.
const defaultPropagation = 5 * time.Millisecond

// maxPropagation is the longest allowance [WithPropagation] accepts.
const maxPropagation = time.Second

// maxTold bounds the responses remembered per thing a client can be told,
// such as a bucket's headers; beyond it, new ones are not recorded, which
// only leaves more 429s unavoidable.
const maxTold = 256

// process identifies one process of a client: its IP and the name it gave in
// [ProcessHeader], "" for the unnamed process of that IP.
type process struct {
	ip, name string
}

// reached is a response that reached one process: when, and which process.
// Until the response is written, at is when it is due; a response whose
// client gave up before it was written reached no one and tells nothing.
type reached struct {
	at      time.Time
	by      process
	written bool // the response was written at at
	lost    bool // the client went away before the response was written
}

// knew reports whether q was sent late enough after r reached its process
// for q's process to know what r said: at least the reaction time after it
// when q comes from that process, at least the propagation allowance when it
// comes from another. A response that reached a process while it was
// stopped (see [Server.Stopped]) reached it when it continued, and not yet
// while it is still stopped.
func (s *Server) knew(r reached, q *request) bool {
	if r.lost {
		return false
	}
	at, ok := s.readAt(r.by.name, r.at)
	if !ok {
		return false
	}
	wait := s.cfg.propagation
	if r.by == q.process {
		wait = reaction
	}
	return !at.Add(wait).After(q.sent)
}

// stop is a span in which a client process was stopped: from when it
// stopped until it continued (zero while it is still stopped).
type stop struct {
	from, to time.Time
}

// maxStops bounds the stops remembered per process, and maxStopped the
// processes with stops remembered; beyond them, the oldest stops are
// forgotten and new processes' stops are not recorded, which only leaves
// more 429s avoidable.
const (
	maxStops   = 64
	maxStopped = 1024
)

// readAt returns when a process named name could read what reached it at
// at: then, or when it continued if it was stopped at that moment; false
// while it is still stopped. s.mu must be held.
func (s *Server) readAt(name string, at time.Time) (time.Time, bool) {
	for _, sp := range s.stops[name] {
		if at.Before(sp.from) {
			break
		}
		if sp.to.IsZero() {
			return time.Time{}, false
		}
		if at.Before(sp.to) {
			return sp.to, true
		}
	}
	return at, true
}

// Stopped tells the emulator that the client process named name (the value
// of its [ProcessHeader], from any client IP) stopped running at t, such as
// on SIGSTOP, until [Server.Continued]. A response that reaches a stopped
// process waits unread: it tells that process, and through it the client's
// other processes, nothing until the process continues. It changes only
// which 429s count as avoidable (see [Stats]). Stops are taken in order: a
// stop while the process is stopped, or one dated before its last
// continue, is ignored.
func (s *Server) Stopped(name string, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.stops[name]
	if n := len(sp); n > 0 && (sp[n-1].to.IsZero() || t.Before(sp[n-1].to)) {
		return
	}
	if sp == nil && len(s.stops) >= maxStopped {
		return
	}
	if len(sp) >= maxStops {
		sp = append(sp[:0], sp[1:]...)
	}
	if s.stops == nil {
		s.stops = make(map[string][]stop)
	}
	s.stops[name] = append(sp, stop{from: t})
}

// Continued tells the emulator that the client process named name, stopped
// since [Server.Stopped], runs again from t. It does nothing for a process
// that is not stopped, and a t before the stop counts as the stop's moment.
func (s *Server) Continued(name string, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sp := s.stops[name]
	if n := len(sp); n > 0 && sp[n-1].to.IsZero() {
		sp[n-1].to = t
		if t.Before(sp[n-1].from) {
			sp[n-1].to = sp[n-1].from
		}
	}
}

// onWrite moves r to the moment res is written, when that is later than
// planned: what a response says counts from then, not from the planned end of
// the way down (a sleep can overrun it). When the response is never written,
// because its client went away first, r is marked lost. r must be guarded by
// the server's mutex.
func onWrite(res *result, r *reached) {
	res.told = append(res.told, r)
}

// written records that the responses told were written at t.
func written(told []*reached, t time.Time) {
	for _, r := range told {
		if t.After(r.at) {
			r.at = t
		}
		r.written = true
	}
}

// lost records that the responses told were written to no one.
func lost(told []*reached) {
	for _, r := range told {
		r.lost = true
	}
}

// firstReached holds, for one thing a client can be told (a bucket's
// headers, a claim's 429), the earliest response that told it to each
// process, with the earlier ones still on their way, any of which may yet
// be lost.
type firstReached []*reached

// add records that res is to reach process by at the planned time at,
// unless a response already written told by no later. Lost responses, and
// responses to a process later than one written to it, are dropped.
func (f *firstReached) add(res *result, by process, at time.Time) {
	f.prune()
	for _, r := range *f {
		if r.by == by && r.written && !r.at.After(at) {
			return
		}
	}
	if len(*f) < maxTold {
		r := &reached{at: at, by: by}
		*f = append(*f, r)
		onWrite(res, r)
	}
}

// prune drops the records that tell nothing more: lost responses, and those
// to a process no earlier than a response written to it.
func (f *firstReached) prune() {
	old := *f
	var kept firstReached
	for i, r := range old {
		if r.lost || old.superseded(i) {
			if kept == nil {
				kept = append(make(firstReached, 0, len(old)), old[:i]...)
			}
			continue
		}
		if kept != nil {
			kept = append(kept, r)
		}
	}
	if kept != nil {
		*f = kept
	}
}

// superseded reports whether a written response to the process of f[i]
// reached it before f[i] did, or at the same time and is listed first.
func (f firstReached) superseded(i int) bool {
	r := f[i]
	for j, w := range f {
		if j == i || !w.written || w.lost || w.by != r.by {
			continue
		}
		if w.at.Before(r.at) || (w.at.Equal(r.at) && j < i) {
			return true
		}
	}
	return false
}

// knewAny reports whether q's process knew what f records when q was sent.
func (s *Server) knewAny(f firstReached, q *request) bool {
	for _, r := range f {
		if s.knew(*r, q) {
			return true
		}
	}
	return false
}
