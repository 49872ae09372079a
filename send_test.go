package ratecord_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ratecord/ratecord"
)

// TestCallerLeavesAfterTheWrite: a caller that gives up while its request
// is in flight, after the request was written, gets its context's error at
// once; the response that comes later is still read, and its headers spend
// the bucket, so the next request is not sent into the window it used.
// (The response's headers are the only word on this bucket: before it, the
// route's bucket was unknown.)
func TestCallerLeavesAfterTheWrite(t *testing.T) {
	arrived := make(chan struct{}, 1)
	answer := make(chan struct{})
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		arrived <- struct{}{}
		<-answer
		announce(w, 1, 0, "10.000")
		w.Write([]byte(`{"id":"1"}`))
	}))
	defer srv.Close()
	tr := realTransport(t)
	client := &http.Client{Transport: tr}
	newRequest := func(ctx context.Context) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/v10/channels/1/messages",
			strings.NewReader(`{"content":"hi"}`))
		req.Header.Set("Authorization", "Bot token")
		return req
	}

	ctx, cancel := context.WithCancel(t.Context())
	// The caller leaves once the request is written (the Transport's hook
	// runs before the caller's) and has reached the server.
	wrote := make(chan struct{}, 1)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote <- struct{}{} },
	})
	done := make(chan error, 1)
	go func() {
		resp, err := client.Do(newRequest(ctx))
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	<-wrote
	<-arrived
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("request whose caller left in flight = %v; want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the caller that left was not released within 5 s")
	}
	close(answer)

	// The response is read without its caller: the store learns the
	// bucket spent for 10 s.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		d, err := tr.Estimate(newRequest(t.Context()))
		if err != nil {
			t.Fatal(err)
		}
		if d > 5*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("estimate %v 5 s after the response of the left request was sent; want the 10 s reset it announced", d)
		}
	}
	short, cancelShort := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancelShort()
	_, err := client.Do(newRequest(short))
	var rle *ratecord.RateLimitError
	if !errors.As(err, &rle) {
		t.Fatalf("request on the bucket the left request spent = %v; want a *RateLimitError", err)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("server saw %d requests; want 1", n)
	}
}

// blockingBase never writes a request: it waits for the request's context
// to end, and says whether it ended.
type blockingBase struct {
	started chan struct{}
	ended   chan error
}

func (b *blockingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.started <- struct{}{}
	<-req.Context().Done()
	b.ended <- req.Context().Err()
	return nil, req.Context().Err()
}

// TestCallerLeavesBeforeTheWrite: a caller that gives up before its
// request was written cancels it, as it would without the Transport, and
// gets the reason it left: context.Canceled for a cancel,
// context.DeadlineExceeded for a deadline, whatever the base transport
// reports of the cancellation of its own context.
func TestCallerLeavesBeforeTheWrite(t *testing.T) {
	leave := map[string]struct {
		ctx  func(context.Context) (context.Context, context.CancelFunc)
		want error
	}{
		"cancel": {context.WithCancel, context.Canceled},
		"deadline": {func(parent context.Context) (context.Context, context.CancelFunc) {
			// The deadline passes while the base holds the request.
			return context.WithTimeout(parent, 50*time.Millisecond)
		}, context.DeadlineExceeded},
	}
	for name, c := range leave {
		t.Run(name, func(t *testing.T) {
			// A stand-in base that reports its context's error, not its
			// cause.
			base := &blockingBase{started: make(chan struct{}, 1), ended: make(chan error, 1)}
			tr := ratecord.NewTransport(base)
			defer tr.Close()
			ctx, cancel := c.ctx(t.Context())
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://discord.com/api/v10/channels/1/messages", nil)
			req.Header.Set("Authorization", "Bot token")
			done := make(chan error, 1)
			go func() {
				_, err := tr.RoundTrip(req)
				done <- err
			}()
			<-base.started
			if c.want == context.Canceled {
				cancel()
			}
			select {
			case err := <-base.ended:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the base transport's request ended with %v; want context.Canceled", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the unwritten request was not cancelled within 5 s of its caller leaving")
			}
			if err := <-done; !errors.Is(err, c.want) {
				t.Errorf("RoundTrip = %v; want %v", err, c.want)
			}
		})
	}
	t.Run("net/http deadline", func(t *testing.T) {
		// A body that takes longer than the caller's deadline keeps the
		// request from being written in time. (net/http waits for a body
		// it is writing to return, so it must return.)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
		}))
		defer srv.Close()
		tr := realTransport(t)
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		body := io.NopCloser(slowBody{time.After(500 * time.Millisecond)})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/v10/channels/1/messages", body)
		req.Header.Set("Authorization", "Bot token")
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
			t.Fatal("RoundTrip answered a request that was not written before its deadline")
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("RoundTrip = %v; want context.DeadlineExceeded", err)
		}
	})
}

// slowBody is a request body that ends, empty, when its channel fires.
type slowBody struct{ end <-chan time.Time }

func (b slowBody) Read([]byte) (int, error) {
	<-b.end
	return 0, io.EOF
}

// TestResponseBodyEndsWithItsCaller: the body of a response delivered to
// its caller still ends when the caller's context does, with the reason
// the caller left.
func TestResponseBodyEndsWithItsCaller(t *testing.T) {
	flushed := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		announce(w, 5, 4, "1.000")
		w.Write([]byte("part"))
		w.(http.Flusher).Flush()
		close(flushed)
		<-r.Context().Done() // the rest never comes
	}))
	defer srv.Close()
	tr := realTransport(t)
	ctx, cancel := context.WithCancelCause(t.Context())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v10/channels/1/messages", nil)
	req.Header.Set("Authorization", "Bot token")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-flushed
	buf := make([]byte, 4)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatalf("first part of the body: %v", err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := resp.Body.Read(buf)
		read <- err
	}()
	left := errors.New("the caller left")
	cancel(left)
	select {
	case err := <-read:
		if !errors.Is(err, left) {
			t.Errorf("read of a body after its caller left = %v; want the reason it left", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the body's read did not end within 5 s of its caller leaving")
	}
}

// TestCloseEndsResponsesReadWithoutCallers: Close cancels the requests
// whose callers left after the write and whose responses have not come,
// and returns once they are reported.
func TestCloseEndsResponsesReadWithoutCallers(t *testing.T) {
	arrived := make(chan struct{}, 1)
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- struct{}{}
		<-r.Context().Done() // never answers
		close(ended)
	}))
	defer srv.Close()
	tr := ratecord.NewTransport(realBase(t))
	ctx, cancel := context.WithCancel(t.Context())
	wrote := make(chan struct{}, 1)
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote <- struct{}{} },
	})
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v10/channels/1/messages", nil)
	req.Header.Set("Authorization", "Bot token")
	done := make(chan error, 1)
	go func() {
		_, err := tr.RoundTrip(req)
		done <- err
	}()
	<-wrote
	<-arrived
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("RoundTrip = %v; want context.Canceled", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- tr.Close() }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5 s with a response still awaited")
	}
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the awaited request was not cancelled by Close")
	}
}

// TestLeftResponsesLeaveTheRoundTripEstimate: the round trips of
// responses read after their callers left are not folded into the
// estimate of the round trip, which refuses a request whose deadline
// leaves less: they are the slow ones, and a few of them would refuse
// every caller with a short deadline.
func TestLeftResponsesLeaveTheRoundTripEstimate(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("slow") != "" {
			time.Sleep(300 * time.Millisecond)
		}
		announce(w, 1000, 999, "60.000")
	}))
	defer srv.Close()
	tr := realTransport(t)
	client := &http.Client{Transport: tr}
	do := func(ctx context.Context, query string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v10/channels/1/messages"+query, nil)
		req.Header.Set("Authorization", "Bot token")
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for range 3 {
		if err := do(t.Context(), ""); err != nil {
			t.Fatal(err)
		}
	}
	for range 6 {
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		err := do(ctx, "?slow=1")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("slow request with a 100 ms deadline = %v; want context.DeadlineExceeded", err)
		}
	}
	// The slow responses have come: the request below must be sent,
	// whatever they took (folded in, they would have taken the estimate
	// past its deadline).
	time.Sleep(400 * time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := do(ctx, ""); err != nil {
		t.Errorf("request with a 100 ms deadline after responses read without their callers = %v; want it sent", err)
	}
}

// announce sets the rate-limit headers of bucket "abcd" on w.
func announce(w http.ResponseWriter, limit, remaining int, resetAfter string) {
	w.Header().Set("X-RateLimit-Bucket", "abcd")
	w.Header().Set("X-RateLimit-Limit", strconv.Itoa(limit))
	w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(remaining))
	w.Header().Set("X-RateLimit-Reset-After", resetAfter)
}

// realBase returns a net/http Transport, its idle connections closed when
// t ends: one that reports its writes to httptrace.
func realBase(t *testing.T) *http.Transport {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return base
}

// realTransport returns a Transport over realBase, closed when t ends.
func realTransport(t *testing.T) *ratecord.Transport {
	tr := ratecord.NewTransport(realBase(t))
	t.Cleanup(func() { tr.Close() })
	return tr
}
