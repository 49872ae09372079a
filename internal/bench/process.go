package bench

import (
	"net/http"

	"github.com/ratecord/ratecord/discordtest"
)

// processHeader carries the number of the worker (a process, or a
// goroutine group with -workers) that sent a request, so that the emulator
// tells the workers apart as it would processes.
const processHeader = discordtest.ProcessHeader

// processTransport marks every request with the worker's number in
// processHeader. It sits under the limiter, on the base transport it wraps,
// so it marks each attempt that leaves for the emulator, retries included;
// it also arms the cancellation of [Env.CancelAfterSend] as a request first
// leaves.
type processTransport struct {
	next   http.RoundTripper
	worker string
}

func (t *processTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if a, ok := req.Context().Value(afterSendKey{}).(*afterSend); ok {
		a.arm()
	}
	// The caller's request is not ours to change.
	out := req.Clone(req.Context())
	out.Header.Set(processHeader, t.worker)
	return t.next.RoundTrip(out)
}
