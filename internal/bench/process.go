package bench

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratecord/ratecord/discordtest"
)

// processHeader carries the number of the worker (a process, or a
// goroutine group with -workers) that sent a request, so that the emulator
// tells the workers apart as it would processes.
const processHeader = discordtest.ProcessHeader

// processTransport marks every request with the worker's number in
// processHeader, and the moment it leaves in [discordtest.SentHeader]. It
// sits under the limiter, on the base transport it wraps, so it marks each
// attempt that leaves for the emulator, retries included;
// it also arms the cancellation of [Env.CancelAfterSend] as a request first
// leaves. With trace set, it records every attempt in it (-trace-avoidable).
type processTransport struct {
	next   http.RoundTripper
	worker string
	part   int
	trace  *recorder
}

func (t *processTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if a, ok := req.Context().Value(afterSendKey{}).(*afterSend); ok {
		a.arm()
	}
	// The caller's request is not ours to change.
	out := req.Clone(req.Context())
	out.Header.Set(processHeader, t.worker)
	// The emulator runs on this host: the moment the limiter let the
	// request go is what it judges, however long the host takes to
	// start the emulator's handler.
	sent := time.Now()
	out.Header.Set(discordtest.SentHeader, strconv.FormatInt(sent.UnixNano(), 10))
	if t.trace == nil {
		return t.next.RoundTrip(out)
	}
	a := Attempt{Part: t.part, Method: out.Method, Path: strings.TrimPrefix(out.URL.Path, apiPrefix), Sent: sent}
	resp, err := t.next.RoundTrip(out)
	a.Got = time.Now()
	if err == nil {
		a.Status, a.Scope = resp.StatusCode, resp.Header.Get("X-RateLimit-Scope")
	}
	t.trace.record(a)
	return resp, err
}
