package ratecord

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ratecord/ratecord/store"
)

// A request that has been written counts at Discord whatever its caller
// does next, and its response says what it spent: the bucket's remaining
// count and reset, or the wait of a 429. A caller that gives up while its
// request is in flight (its context ends: a deadline, an abort) would
// leave the store only the fact that the request went, and the next
// request, of this process or of any other sharing the store, could go
// into the window the lost response would have shown spent. So once the
// base transport reports the request written (httptrace's WroteRequest),
// the request no longer ends with its caller's context: the caller gets
// its context's error at once, and the response is read in the
// background, its limits reported to the store like any response's, its
// body closed. A caller that gives up before the write cancels the
// request, as before; so does every caller with a base transport that
// does not report writes.

// detachedWait bounds how long the response of a request whose caller
// gave up after it was written is waited for; the request is cancelled
// then, and reported as sent without an answer.
const detachedWait = 30 * time.Second

// The states of a request in flight (see send).
const (
	sendWaiting   int32 = iota // no answer yet, the caller waits
	sendDelivered              // the answer went to the caller
	sendDetached               // the caller left after the write: read in the background
)

// roundTrip is what the base transport returned.
type roundTrip struct {
	resp *http.Response
	err  error
}

// inflight is a request handed to the base transport by send, all of its
// parts in one allocation.
type inflight struct {
	t       *Transport
	out     *http.Request // sent with ctx
	ctx     context.Context
	caller  context.Context         // the caller's context
	cancel  context.CancelCauseFunc // ends ctx
	stop    func() bool             // unhooks leave from the caller's context
	written atomic.Bool
	state   atomic.Int32
	trace   httptrace.ClientTrace
	done    chan roundTrip
	body    sentBody
	p       *store.Reservation // the request's grant
	recheck bool               // whether run checks p has not lapsed
}

// wrote is the request's WroteRequest hook.
func (f *inflight) wrote(info httptrace.WroteRequestInfo) {
	if info.Err == nil {
		f.written.Store(true)
	}
}

// leave runs when the caller's context ends: it ends the request, unless
// the request was written and its answer has not gone to the caller (see
// send).
func (f *inflight) leave() {
	if !f.written.Load() || f.state.Load() == sendDelivered {
		f.end()
	}
}

// end ends the request for the reason its caller left, so that the base
// transport reports that reason (net/http reports a request's context's
// cause), not a cancellation of its own.
func (f *inflight) end() {
	f.cancel(context.Cause(f.caller))
}

// run hands the request to the base transport, unless its grant lapsed
// since send was called (see errLapsed).
func (f *inflight) run() {
	if f.recheck && f.p.Lapsed() {
		f.done <- roundTrip{nil, errLapsed}
		return
	}
	resp, err := f.t.base.RoundTrip(f.out)
	f.done <- roundTrip{resp, err}
}

// release ends the request's own context once its caller is done with it.
func (f *inflight) release() {
	f.stop()
	f.cancel(nil)
}

// errLapsed is what send returns when out's grant lapsed between the
// caller's check and the hand-off to the base transport: out was not sent,
// and the caller claims again.
var errLapsed = errors.New("ratecord: the grant lapsed before the request left")

// send hands out to the base transport and returns what it returned.
// detached reports that out's caller gave up after out was written: send
// then returned the error of out's context, and reads the response in the
// background, reporting it on p (which is no longer the caller's). With
// recheck, send checks once more that p has not lapsed just before the
// base transport gets out, and returns errLapsed if it has: the checks
// before it run while the process may be descheduled, and what is left
// between this one and the write is the base transport's own path.
func (t *Transport) send(out *http.Request, p *store.Reservation, key routeKey, recheck bool) (resp *http.Response, detached bool, err error) {
	ctx := out.Context()
	if ctx.Done() == nil {
		if recheck && p.Lapsed() {
			return nil, false, errLapsed
		}
		resp, err := t.base.RoundTrip(out)
		return resp, false, err
	}
	f := &inflight{t: t, caller: ctx, done: make(chan roundTrip, 1), p: p, recheck: recheck}
	f.trace.WroteRequest = f.wrote
	f.ctx, f.cancel = context.WithCancelCause(httptrace.WithClientTrace(context.WithoutCancel(ctx), &f.trace))
	f.out = out.WithContext(f.ctx)
	f.stop = context.AfterFunc(ctx, f.leave)
	go f.run()
	var r roundTrip
	select {
	case r = <-f.done:
	case <-ctx.Done():
		if f.written.Load() && f.state.CompareAndSwap(sendWaiting, sendDetached) {
			if t.holdBackground() {
				f.stop()
				go t.readDetached(f, p, key)
				return nil, true, context.Cause(ctx)
			}
			// The Transport is closing: the request ends with its caller.
		}
		// Not written when the caller left (leave may not have run yet,
		// or may have found it written since): the request ends now.
		f.end()
		r = <-f.done
	}
	f.state.Store(sendDelivered)
	if r.resp == nil {
		f.release()
		if ctx.Err() != nil && errors.Is(r.err, context.Canceled) {
			// Cancelled because its caller left: a base that reports
			// its context's error rather than its cause said only
			// "canceled". Say why the caller left, as the base would
			// have with the caller's own context (a deadline is then
			// context.DeadlineExceeded).
			r.err = context.Cause(ctx)
		}
		return nil, false, r.err
	}
	if ctx.Err() != nil {
		// The caller left while the answer came: its body ends with it.
		f.end()
	}
	if r.resp.StatusCode != http.StatusSwitchingProtocols {
		// (A 101's body is the connection, for the caller to keep: the
		// caller's context stays bound to it.)
		f.body = sentBody{ReadCloser: r.resp.Body, release: f.release}
		r.resp.Body = &f.body
	}
	return r.resp, false, r.err
}

// holdBackground counts one more response read in the background, unless
// the Transport is closing (Close waits for those it counted).
func (t *Transport) holdBackground() bool {
	t.bgMu.Lock()
	defer t.bgMu.Unlock()
	select {
	case <-t.done:
		return false
	default:
	}
	t.background.Add(1)
	return true
}

// readDetached waits for the answer to a request whose caller left after
// it was written, up to detachedWait or until the Transport closes, and
// reports what it says on p.
func (t *Transport) readDetached(f *inflight, p *store.Reservation, key routeKey) {
	defer t.background.Done()
	defer f.cancel(nil)
	timer := time.NewTimer(detachedWait)
	defer timer.Stop()
	var r roundTrip
	answered := false
	select {
	case r = <-f.done:
		answered = true
	case <-timer.C:
	case <-t.ctx.Done():
	}
	if !answered {
		// No answer in time, or the Transport closes: cancelled, the
		// request ends at once.
		f.cancel(nil)
		r = <-f.done
	}
	var lim limits
	if r.resp != nil {
		if r.err == nil {
			// Its round trip is not folded into the estimate that tells
			// whether a request has time to come back (tooLate): it is the
			// round trip of a request that did not, and the estimate is of
			// those that do.
			lim, _ = t.readLimits(r.resp, key) // a 429 whose body broke off keeps its headers' limits
		}
		r.resp.Body.Close()
	}
	t.report(context.Background(), p, t.update(true, r.resp, &lim))
}

// sentBody is the body of a response whose request was sent with a
// context of its own (see send): closing it releases that context.
type sentBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
}

func (b *sentBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.release)
	return err
}
