package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/ratecord/ratecord"
)

// errorBody is the JSON body of the proxy's own error responses. Its
// top-level fields follow Discord's error and 429 bodies, so that Discord
// libraries read message, retry_after and global as from Discord; ratecord
// says why the proxy answered itself.
type errorBody struct {
	Message    string      `json:"message"`
	Code       int         `json:"code"`
	RetryAfter float64     `json:"retry_after,omitempty"`
	Global     *bool       `json:"global,omitempty"`
	Ratecord   errorDetail `json:"ratecord"`
}

// errorDetail is the "ratecord" object of an error body.
type errorDetail struct {
	// Reason is a stable code: wait_too_long, deadline_exceeded,
	// invalid_budget, unauthorized, webhook_gone, closed,
	// store_unavailable, upstream_error, body_too_large, bad_body,
	// bad_path.
	Reason     string  `json:"reason"`
	Scope      string  `json:"scope,omitempty"`
	Bucket     string  `json:"bucket,omitempty"`
	Route      string  `json:"route,omitempty"`
	RetryAfter float64 `json:"retry_after,omitempty"`
}

// Headers of the proxy's own error responses.
const (
	hdrReason     = "X-Ratecord-Reason"
	hdrScope      = "X-Ratecord-Scope"
	hdrBucket     = "X-Ratecord-Bucket"
	hdrRetryAfter = "X-Ratecord-Retry-After"
)

// handleError answers a request the reverse proxy could not complete:
// ratecord gave up (429 or 503), the body was too large (413), the client
// went away (nothing to answer), or the upstream failed (502).
func (p *proxy) handleError(w http.ResponseWriter, r *http.Request, err error) {
	rec, _ := w.(*recorder)
	note := func(reason string) {
		if rec != nil {
			rec.reason = reason
			rec.err = err
		}
	}
	var rl *ratecord.RateLimitError
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		note("body_too_large")
		writeJSONError(w, http.StatusRequestEntityTooLarge, bodyTooLarge(tooLarge.Limit))
	case errors.As(err, &rl):
		status, reason := giveUpStatus(rl, r)
		note(reason)
		if rec != nil {
			rec.giveUp = rl
		}
		if status == statusClientClosed {
			w.WriteHeader(status)
			return
		}
		writeGiveUp(w, status, reason, rl)
	case r.Context().Err() != nil:
		note("canceled")
		w.WriteHeader(statusClientClosed)
	default:
		note("upstream_error")
		writeJSONError(w, http.StatusBadGateway, errorBody{
			Message:  "ratecord proxy: the upstream could not be reached",
			Ratecord: errorDetail{Reason: "upstream_error"},
		})
	}
}

// statusClientClosed is logged for requests whose client went away before
// the answer; nobody reads it.
const statusClientClosed = 499

// giveUpStatus maps why ratecord gave up to a status and a reason code.
func giveUpStatus(rl *ratecord.RateLimitError, r *http.Request) (int, string) {
	switch reason := ratecord.Reason(rl); reason {
	case "wait_too_long", "invalid_budget", "unauthorized", "webhook_gone", "deadline_exceeded":
		return http.StatusTooManyRequests, reason
	case "closed":
		return http.StatusServiceUnavailable, reason
	case "canceled":
		return statusClientClosed, reason
	}
	if r.Context().Err() != nil {
		return statusClientClosed, "canceled"
	}
	return http.StatusServiceUnavailable, "store_unavailable"
}

// writeGiveUp writes the answer to a request ratecord gave up on.
func writeGiveUp(w http.ResponseWriter, status int, reason string, rl *ratecord.RateLimitError) {
	wait := rl.RetryAfter
	if wait <= 0 {
		wait = time.Second // unknown: a client must not retry in a tight loop
	}
	secs := math.Ceil(wait.Seconds()*1000) / 1000
	h := w.Header()
	h.Set("Retry-After", strconv.FormatInt(int64(math.Ceil(wait.Seconds())), 10))
	h.Set(hdrRetryAfter, strconv.FormatFloat(secs, 'f', 3, 64))
	if rl.Scope != "" {
		h.Set(hdrScope, string(rl.Scope))
	}
	if rl.Bucket != "" {
		h.Set(hdrBucket, rl.Bucket)
	}
	msg := "ratecord: " + reason
	if rl.Err != nil && status == http.StatusTooManyRequests {
		msg = rl.Err.Error() // a sentinel's text, such as "ratecord: wait exceeds the maximum"
	}
	if reason == "store_unavailable" {
		msg = "ratecord: the rate-limit store is unavailable"
	}
	body := errorBody{
		Message:    msg,
		RetryAfter: secs,
		Ratecord: errorDetail{
			Reason: reason, Scope: string(rl.Scope), Bucket: rl.Bucket, Route: rl.Route, RetryAfter: secs,
		},
	}
	if status == http.StatusTooManyRequests {
		global := rl.Scope == ratecord.ScopeGlobal
		body.Global = &global
	}
	writeJSONError(w, status, body)
}

func bodyTooLarge(limit int64) errorBody {
	return errorBody{
		Message:  fmt.Sprintf("ratecord proxy: request body larger than %d bytes", limit),
		Ratecord: errorDetail{Reason: "body_too_large"},
	}
}

// writeJSONError writes an error body with its status and X-Ratecord-Reason.
func writeJSONError(w http.ResponseWriter, status int, body errorBody) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	h.Set(hdrReason, body.Ratecord.Reason)
	b, _ := json.Marshal(body)
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}
