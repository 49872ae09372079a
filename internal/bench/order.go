package bench

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// orderSlack is how much earlier a waiting request must have been issued
// than one that overtakes it for the overtaking to count: requests issued
// by goroutines within a millisecond of each other have no order to keep.
const orderSlack = time.Millisecond

// renamePrefix starts the channel name of a numbered rename; the number
// follows.
const renamePrefix = `{"name":"rename-`

// orderBook follows numbered requests from when the load issues them to when
// they first leave for the emulator, in one process, and counts those that
// left while a request issued earlier was still waiting.
type orderBook struct {
	mu        sync.Mutex // guards every field below
	next      int64
	waiting   map[int64]time.Time // issued, not yet sent once: number -> when issued
	overtaken int                 // requests sent while an earlier one waited
}

// issue numbers a request about to be sent.
func (o *orderBook) issue() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.waiting == nil {
		o.waiting = make(map[int64]time.Time)
	}
	o.next++
	o.waiting[o.next] = time.Now()
	return o.next
}

// sent notes that request n left for the emulator. Only its first sending
// counts; a limiter's retry of it is not an overtaking.
func (o *orderBook) sent(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	at, ok := o.waiting[n]
	if !ok {
		return
	}
	delete(o.waiting, n)
	for m, t := range o.waiting {
		if m < n && at.Sub(t) >= orderSlack {
			o.overtaken++
			return
		}
	}
}

// done forgets request n when the load is done with it, sent or not (a
// limiter may give up on it).
func (o *orderBook) done(n int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.waiting, n)
}

// count returns the overtakings so far.
func (o *orderBook) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.overtaken
}

// renameBody returns the body of rename n.
func renameBody(n int64) string { return renamePrefix + strconv.FormatInt(n, 10) + `"}` }

// orderTransport notes in book when a numbered rename leaves for the
// emulator: it sits under the limiter, so it sees the order the limiter
// releases requests in.
type orderTransport struct {
	next http.RoundTripper
	book *orderBook
}

func (t *orderTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == http.MethodPatch && req.GetBody != nil {
		if body, err := req.GetBody(); err == nil {
			data, _ := io.ReadAll(io.LimitReader(body, 256))
			body.Close()
			if rest, ok := bytes.CutPrefix(data, []byte(renamePrefix)); ok {
				if i := bytes.IndexByte(rest, '"'); i > 0 {
					if n, err := strconv.ParseInt(string(rest[:i]), 10, 64); err == nil {
						t.book.sent(n)
					}
				}
			}
		}
	}
	return t.next.RoundTrip(req)
}
