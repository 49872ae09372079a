package discordtest

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// toldLimit is a limit whose 429s are judged by what an earlier response
// told the client.
type toldLimit struct {
	name string
	opts []Option
	// tell sends the requests after which the limit refuses the next one;
	// the last of them, from process by, tells the client so.
	tell func(h *harness, by string)
	// again sends the request judged, from process from, and checks that it
	// is refused.
	again func(h *harness, from string)
}

// toldLimits returns every limit whose 429s a response can make avoidable.
func toldLimits() []toldLimit {
	const me, messages, rename = "/api/v10/users/@me", "/api/v10/channels/1/messages", "/api/v10/channels/1"
	const react = "/api/v10/channels/1/messages/2/reactions/x/@me"
	return []toldLimit{
		{
			name: "edge block",
			opts: []Option{WithEdgeLimit(EdgeLimit{Limit: 1, Window: time.Second, Block: 10 * time.Second, BanAfter: -1})},
			tell: func(h *harness, by string) {
				h.doFrom(by, "GET", me, botA, "").want(h.t, 200)
				h.doFrom(by, "GET", me, botA, "").wantEdgeBlock(h.t) // the first of the episode: unavoidable
			},
			// Another token: a block is the IP's, whatever the token.
			again: func(h *harness, from string) { h.doFrom(from, "GET", me, botB, "").wantEdgeBlock(h.t) },
		},
		{
			name: "hidden sublimit",
			opts: []Option{WithHiddenSublimit(1, time.Minute)},
			tell: func(h *harness, by string) {
				h.doFrom(by, "PATCH", rename, botA, `{"name":"a"}`).want(h.t, 200)
				h.doFrom(by, "PATCH", rename, botA, `{"name":"b"}`).want(h.t, 429) // nothing announced it: unavoidable
			},
			again: func(h *harness, from string) {
				h.doFrom(from, "PATCH", rename, botA, `{"name":"c"}`).want(h.t, 429, "X-RateLimit-Scope", "user")
			},
		},
		{
			name: "bucket",
			opts: []Option{WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 1, Window: 10 * time.Second})},
			tell: func(h *harness, by string) {
				h.doFrom(by, "POST", messages, botA, `{}`).want(h.t, 200, "X-RateLimit-Remaining", "0")
			},
			again: func(h *harness, from string) {
				h.doFrom(from, "POST", messages, botA, `{}`).want(h.t, 429, "X-RateLimit-Scope", "user")
			},
		},
		{
			name: "bucket with a claim",
			opts: []Option{WithBuckets(Bucket{Hash: hashReaction, Limit: 1, Window: time.Minute,
				Claim: Claim{Limit: 200, Remaining: 199, ResetAfter: 10 * time.Minute}})},
			tell: func(h *harness, by string) {
				h.doFrom(by, "PUT", react, botA, "").want(h.t, 204)
				h.doFrom(by, "PUT", react, botA, "").want(h.t, 429) // the headers claimed room: unavoidable
			},
			again: func(h *harness, from string) {
				h.doFrom(from, "PUT", react, botA, "").want(h.t, 429, "X-RateLimit-Scope", "user")
			},
		},
	}
}

// TestProcessesAreJudgedByWhatReachedThem: a request is avoidable once its
// process could know it would be limited, a millisecond after the response
// that said so reached that process, the propagation allowance (5 ms by
// default) after it reached another process of the client.
func TestProcessesAreJudgedByWhatReachedThem(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	tests := []struct {
		name           string
		opts           []Option
		teller, sender string // process names; "" sends no ProcessHeader
		after          time.Duration
		avoidable      bool
	}{
		{"same process within a millisecond", nil, "worker-1", "worker-1", ms / 2, false},
		{"same process 2ms after", nil, "worker-1", "worker-1", 2 * ms, true},
		{"other process 2ms after", nil, "worker-1", "worker-2", 2 * ms, false},
		{"other process 6ms after", nil, "worker-1", "worker-2", 6 * ms, true},
		{"without the header 2ms after", nil, "", "", 2 * ms, true},
		{"named process 2ms after the unnamed one", nil, "", "worker-1", 2 * ms, false},
		{"named process 6ms after the unnamed one", nil, "", "worker-1", 6 * ms, true},
		{"propagation 10ms, other process 6ms after", []Option{WithPropagation(10 * ms)}, "worker-1", "worker-2", 6 * ms, false},
		{"propagation 10ms, other process 10ms after", []Option{WithPropagation(10 * ms)}, "worker-1", "worker-2", 10 * ms, true},
		{"propagation 10ms, same process 2ms after", []Option{WithPropagation(10 * ms)}, "worker-1", "worker-1", 2 * ms, true},
	}
	for _, l := range toldLimits() {
		for _, tt := range tests {
			t.Run(l.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, append(l.opts, tt.opts...)...)
				l.tell(h, tt.teller)
				h.clock.Advance(tt.after)
				l.again(h, tt.sender)
				st := h.srv.Stats()
				if got := st.Log[len(st.Log)-1].Avoidable; got != tt.avoidable {
					t.Errorf("a request from %q %v after the response to %q reached it: avoidable = %v; want %v",
						tt.sender, tt.after, tt.teller, got, tt.avoidable)
				}
				if want := map[bool]int{false: 0, true: 1}[tt.avoidable]; st.Avoidable != want {
					t.Errorf("stats avoidable = %d; want %d (the responses that told were unavoidable)", st.Avoidable, want)
				}
			})
		}
	}
}

// TestSentHeaderDatesTheRequest: a request judged by when its SentHeader
// says it left, not by when the handler began, as long as that is within
// maxSentLead before it; a header out of those bounds, or unreadable, is
// ignored.
func TestSentHeaderDatesTheRequest(t *testing.T) {
	t.Parallel()
	const ms = time.Millisecond
	const messages = "/api/v10/channels/1/messages"
	tests := []struct {
		name      string
		sent      func(told time.Time) string // the header, from when the telling response reached its process
		avoidable bool
	}{
		{"no header", func(time.Time) string { return "" }, true},
		{"sent 2ms after", func(told time.Time) string { return stamp(told.Add(2 * ms)) }, false},
		{"sent 6ms after", func(told time.Time) string { return stamp(told.Add(6 * ms)) }, true},
		{"dated before the lead allowed", func(told time.Time) string { return stamp(told.Add(-200 * ms)) }, true},
		{"dated after the handler began", func(told time.Time) string { return stamp(told.Add(time.Second)) }, true},
		{"unreadable", func(time.Time) string { return "soon" }, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 1, Window: 10 * time.Second}))
			h.doFrom("worker-1", "POST", messages, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "0")
			told := h.srv.Stats().Log[0].Reached
			// The handler of the next request begins 20 ms later.
			h.clock.Advance(20 * ms)
			extra := http.Header{}
			if v := tt.sent(told); v != "" {
				extra.Set(SentHeader, v)
			}
			h.doWith("worker-2", extra, "POST", messages, botA, `{}`).want(t, 429, SentHeader, "")
			st := h.srv.Stats()
			if got := st.Log[len(st.Log)-1].Avoidable; got != tt.avoidable {
				t.Errorf("avoidable = %v; want %v", got, tt.avoidable)
			}
		})
	}
}

func stamp(t time.Time) string { return strconv.FormatInt(t.UnixNano(), 10) }

// TestUnnamedProcessIsPerIP: without ProcessHeader, requests from one IP
// are one process, whatever their port; another IP with the same token is
// another process.
func TestUnnamedProcessIsPerIP(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 1, Window: 10 * time.Second}))
	const path = "/api/v10/channels/1/messages"
	serve(h.srv, "POST", path, botA, "10.0.0.1:1000")
	h.clock.Advance(2 * time.Millisecond)
	for _, addr := range []string{"10.0.0.2:1000", "10.0.0.1:2000"} {
		if rec := serve(h.srv, "POST", path, botA, addr); rec.Code != 429 {
			t.Fatalf("request from %s: status %d; want 429", addr, rec.Code)
		}
	}
	log := h.srv.Stats().Log
	if len(log) != 3 || log[1].Avoidable || !log[2].Avoidable {
		t.Errorf("log = %+v; want the 429 from the other IP unavoidable, the one from the same IP avoidable", log)
	}
}

// TestEachProcessIsToldByItsOwnResponses: a process that got the bucket's
// headers itself needs only a millisecond, even within the propagation
// allowance of an earlier response to another process.
func TestEachProcessIsToldByItsOwnResponses(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 2, Window: 10 * time.Second}))
	const path = "/api/v10/channels/1/messages"
	h.doFrom("worker-1", "POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "1")
	h.clock.Advance(time.Millisecond)
	h.doFrom("worker-2", "POST", path, botA, `{}`).want(t, 200, "X-RateLimit-Remaining", "0")
	h.clock.Advance(1500 * time.Microsecond) // 2.5 ms after worker-1's response, 1.5 ms after worker-2's
	h.doFrom("worker-2", "POST", path, botA, `{}`).want(t, 429)
	h.doFrom("worker-3", "POST", path, botA, `{}`).want(t, 429)
	log := h.srv.Stats().Log
	if !log[2].Avoidable || log[3].Avoidable {
		t.Errorf("avoidable of worker-2's and worker-3's 429s = %v, %v; want true, false", log[2].Avoidable, log[3].Avoidable)
	}
}

// TestEdgeProbeAcrossProcesses: behind one IP, a request from another
// process within the allowance of a probe's block response is judged by the
// block responses before it, so it is a lone probe too; after the
// allowance, it is not.
func TestEdgeProbeAcrossProcesses(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithEdgeLimit(EdgeLimit{Limit: 1, Window: time.Second, Block: time.Minute, BanAfter: -1}))
	const path = "/api/v10/users/@me"
	h.doFrom("worker-1", "GET", path, botA, "").want(t, 200)
	h.doFrom("worker-1", "GET", path, botA, "").wantEdgeBlock(t) // unavoidable: the first
	h.clock.Advance(time.Second)
	h.doFrom("worker-1", "GET", path, botA, "").wantEdgeBlock(t) // a probe a second later: unavoidable
	h.clock.Advance(3 * time.Millisecond)
	h.doFrom("worker-2", "GET", path, botA, "").wantEdgeBlock(t) // has not heard of the probe's answer: unavoidable
	h.clock.Advance(3 * time.Millisecond)
	h.doFrom("worker-3", "GET", path, botA, "").wantEdgeBlock(t) // 6 ms after the probe's answer: avoidable
	var got []bool
	for _, e := range h.srv.Stats().Log[1:] {
		got = append(got, e.Avoidable)
	}
	if fmt.Sprint(got) != "[false false false true]" {
		t.Errorf("avoidable of the blocks = %v; want [false false false true]", got)
	}
}

// TestProcessHeaderIsNotEchoed: the process name appears neither in
// responses nor in the stats.
func TestProcessHeaderIsNotEchoed(t *testing.T) {
	t.Parallel()
	h := newHarness(t, WithBuckets(Bucket{Hash: hashMessageCreate, Limit: 1, Window: 10 * time.Second}))
	const name = "worker-secret-name"
	for _, status := range []int{200, 429} {
		r := h.doFrom(name, "POST", "/api/v10/channels/1/messages", botA, `{}`)
		r.want(t, status, ProcessHeader, "")
		for k, vs := range r.header {
			if strings.Contains(strings.Join(vs, " "), name) {
				t.Errorf("response header %s = %q holds the process name", k, vs)
			}
		}
		if strings.Contains(string(r.body), name) {
			t.Errorf("response body %s holds the process name", r.body)
		}
	}
	if dump := fmt.Sprintf("%+v", h.srv.Stats()); strings.Contains(dump, name) {
		t.Errorf("stats hold the process name: %s", dump)
	}
}

func TestPropagationOption(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		opts []Option
		want time.Duration
	}{
		{"default", nil, 5 * time.Millisecond},
		{"set", []Option{WithPropagation(20 * time.Millisecond)}, 20 * time.Millisecond},
		{"negative", []Option{WithPropagation(-time.Second)}, time.Millisecond},
		{"zero", []Option{WithPropagation(0)}, time.Millisecond},
		{"below the reaction time", []Option{WithPropagation(500 * time.Microsecond)}, time.Millisecond},
		{"an hour", []Option{WithPropagation(time.Hour)}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := newServer(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.cfg.propagation; got != tt.want {
				t.Errorf("propagation = %v; want %v", got, tt.want)
			}
		})
	}
}
