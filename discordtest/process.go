package discordtest

import (
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

// maxProcesses bounds the processes remembered per thing a client can be
// told, such as a bucket's headers; the first to be told are kept.
const maxProcesses = 64

// process identifies one process of a client: its IP and the name it gave in
// [ProcessHeader], "" for the unnamed process of that IP.
type process struct {
	ip, name string
}

// reached is a response that reached one process: when, and which process.
type reached struct {
	at time.Time
	by process
}

// knew reports whether q was sent late enough after r reached its process
// for q's process to know what r said: at least the reaction time after it
// when q comes from that process, at least the propagation allowance when it
// comes from another.
func (s *Server) knew(r reached, q *request) bool {
	wait := s.cfg.propagation
	if r.by == q.process {
		wait = reaction
	}
	return !r.at.Add(wait).After(q.sent)
}

// onWrite moves r to the moment res is written, when that is later than
// planned: what a response says counts from then, not from the planned end of
// the way down (a sleep can overrun it). r must be guarded by the server's
// mutex.
func onWrite(res *result, r *reached) {
	res.delivered = append(res.delivered, func(t time.Time) {
		if t.After(r.at) {
			r.at = t
		}
	})
}

// firstReached holds, for one thing a client can be told (a bucket's
// headers, a claim's 429), the earliest response that told it to each
// process.
type firstReached []*reached

// add records that res is to reach process by at the planned time at, when
// it is the earliest response that tells by. Beyond maxProcesses processes,
// new ones are not recorded: judging them by what the others were told only
// leaves more 429s unavoidable.
func (f *firstReached) add(res *result, by process, at time.Time) {
	for i, r := range *f {
		if r.by != by {
			continue
		}
		if at.Before(r.at) {
			// A new record: the one replaced is still moved by its own write.
			earlier := &reached{at: at, by: by}
			(*f)[i] = earlier
			onWrite(res, earlier)
		}
		return
	}
	if len(*f) < maxProcesses {
		r := &reached{at: at, by: by}
		*f = append(*f, r)
		onWrite(res, r)
	}
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
