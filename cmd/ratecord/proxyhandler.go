package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"time"

	"github.com/ratecord/ratecord"
)

// ServeHTTP checks the request target before anything else, answers
// /healthz and /metrics, and forwards /api/... upstream.
func (p *proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	path, err := checkTarget(r.RequestURI)
	if err == nil && path != r.URL.Path {
		err = errTargetMismatch
	}
	if err != nil {
		rec.refusedTarget = true
		rec.err = err // never quotes the target
		p.refuse(rec, http.StatusBadRequest, "bad_path", err.Error())
		p.logRequest(r, rec, time.Since(start))
		return
	}
	switch path {
	case "/healthz":
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok")
		return
	case "/metrics":
		p.metrics.ServeHTTP(w, r)
		return
	}
	p.forward(rec, w, r)
	p.logRequest(r, rec, time.Since(start))
}

// refuse answers a request the proxy will not forward with a JSON error
// whose message is "ratecord proxy: " and msg.
func (p *proxy) refuse(rec *recorder, status int, reason, msg string) {
	rec.reason = reason
	writeJSONError(rec, status, errorBody{Message: "ratecord proxy: " + msg, Ratecord: errorDetail{Reason: reason}})
}

// forward checks the request's path, its Authorization, the client's
// authentication, the cap on requests in flight and the body, and hands
// the request on upstream.
func (p *proxy) forward(rec *recorder, w http.ResponseWriter, r *http.Request) {
	if !isAPIPath(r.URL.Path) {
		p.refuse(rec, http.StatusBadRequest, "bad_path", errNotAPI.Error())
		return
	}
	auth := r.Header.Values("Authorization")
	switch {
	case len(auth) > 1:
		p.refuse(rec, http.StatusBadRequest, "bad_authorization", "more than one Authorization header")
		return
	case len(auth) == 1 && len(auth[0]) > p.cfg.maxAuthBytes:
		p.refuse(rec, http.StatusBadRequest, "bad_authorization", fmt.Sprintf("Authorization longer than %d bytes", p.cfg.maxAuthBytes))
		return
	}
	if !p.authenticated(r) {
		p.refuse(rec, http.StatusUnauthorized, "client_auth", "this proxy needs the "+hdrClientSecret+" header or an allowed bot token")
		return
	}
	select {
	case p.inFlight <- struct{}{}:
		defer func() { <-p.inFlight }()
	default:
		rec.Header().Set("Retry-After", "1")
		p.refuse(rec, http.StatusServiceUnavailable, "overloaded", fmt.Sprintf("more than %d requests in flight", p.cfg.maxInFlight))
		return
	}
	if r.ContentLength > p.cfg.maxBody {
		rec.reason = "body_too_large"
		writeJSONError(rec, http.StatusRequestEntityTooLarge, bodyTooLarge(p.cfg.maxBody))
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = http.MaxBytesReader(w, r.Body, p.cfg.maxBody)
		if n := r.ContentLength; n > 0 && n <= p.cfg.replayBody && p.reserveBuffer(n) {
			defer p.buffered.Add(-n)
			if !p.bufferBody(rec, r) {
				return
			}
		}
	}
	p.send(rec, r)
}

// authenticated reports whether r may use the proxy: always without
// client authentication, else with the client secret or an allowed
// Authorization.
func (p *proxy) authenticated(r *http.Request) bool {
	a := p.cfg.auth
	return !a.enabled() || a.bySecret(r.Header) || a.byCredential(r.Header.Get("Authorization"))
}

// reserveBuffer reports whether n more bytes of bodies may be buffered,
// counting them if so: the bodies buffered at once never exceed
// -max-buffered, whatever the clients send.
func (p *proxy) reserveBuffer(n int64) bool {
	if p.buffered.Add(n) > p.cfg.maxBuffered {
		p.buffered.Add(-n)
		return false
	}
	return true
}

// bufferBody reads a small body into memory, so that ratecord can send the
// request again after a 429.
func (p *proxy) bufferBody(rec *recorder, r *http.Request) bool {
	body := make([]byte, r.ContentLength)
	if _, err := io.ReadFull(r.Body, body); err != nil {
		rec.reason = "bad_body"
		rec.err = err
		writeJSONError(rec, http.StatusBadRequest, errorBody{Message: "ratecord proxy: could not read the request body", Ratecord: errorDetail{Reason: "bad_body"}})
		return false
	}
	r.Body.Close()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return true
}

// rewrite points the outgoing request at the upstream, keeping the
// client's checked path and query, and adds the default token where one is
// allowed. The reverse proxy has already removed hop-by-hop and
// X-Forwarded headers.
func (p *proxy) rewrite(pr *httputil.ProxyRequest) {
	// The path was checked decoded: send it encoded the one way Go
	// encodes it, rather than as the client spelled it.
	pr.Out.URL.RawPath = ""
	pr.SetURL(p.cfg.upstream)
	pr.Out.Header.Del(hdrClientSecret)
	if p.cfg.defaultAuth != "" && pr.Out.Header.Get("Authorization") == "" && !tokenInPath(pr.In.URL.Path) {
		pr.Out.Header.Set("Authorization", p.cfg.defaultAuth)
	}
}

// logRequest writes the request's log line: method, redacted path, status,
// duration and, for an error response, why.
func (p *proxy) logRequest(r *http.Request, rec *recorder, d time.Duration) {
	level := slog.LevelInfo
	if rec.reason != "" && rec.status >= 500 {
		level = slog.LevelWarn
	}
	ctx := r.Context()
	if !p.log.Enabled(ctx, level) {
		return
	}
	if p.fastLog(rec) && p.logAnswered(r, rec, d) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs,
		slog.String("method", r.Method),
		slog.String("path", logPath(r, rec)),
		slog.Int("status", rec.status),
		slog.Float64("duration_ms", durationMS(d)),
		slog.Int64("bytes", rec.bytes))
	if rec.reason != "" {
		attrs = append(attrs, slog.String("reason", rec.reason))
	}
	if rec.giveUp != nil {
		attrs = append(attrs, slog.String("route", rec.giveUp.Route), slog.String("scope", string(rec.giveUp.Scope)),
			slog.String("bucket", rec.giveUp.Bucket), slog.Duration("retry_after", rec.giveUp.RetryAfter))
	}
	if rec.err != nil {
		attrs = append(attrs, slog.String("error", p.redactError(rec.err, r)))
	}
	p.log.LogAttrs(ctx, level, "request", attrs...)
}

// logPath returns the path to log: redacted, or only "REDACTED" when the
// target was refused, since a malformed path can hide a token anywhere.
func logPath(r *http.Request, rec *recorder) string {
	if rec.refusedTarget {
		return "REDACTED"
	}
	return redactPath(r.URL)
}

// redactPath returns the URL's path with webhook and interaction tokens
// replaced; the query is left out.
func redactPath(u *url.URL) string {
	return ratecord.RedactURL(&url.URL{Path: u.Path, RawPath: u.RawPath})
}

// redactError returns an error's text fit for the log: redacted by
// [ratecord.RedactError] (webhook and interaction tokens in URLs and paths,
// query strings), then cleared of the request's path, should it be quoted
// in another form, and of Authorization values.
func (p *proxy) redactError(err error, r *http.Request) string {
	msg := ratecord.RedactError(err).Error()
	if path := r.URL.EscapedPath(); len(path) > 1 {
		msg = strings.ReplaceAll(msg, path, redactPath(r.URL))
	}
	if len(r.URL.Path) > 1 {
		msg = strings.ReplaceAll(msg, r.URL.Path, redactPath(r.URL))
	}
	for _, secret := range []string{r.Header.Get("Authorization"), p.cfg.defaultAuth} {
		if secret != "" {
			msg = strings.ReplaceAll(msg, secret, "REDACTED")
			if _, tok, ok := strings.Cut(secret, " "); ok && tok != "" {
				msg = strings.ReplaceAll(msg, tok, "REDACTED")
			}
		}
	}
	return msg
}

// recorder notes what the proxy answered, for the request's log line.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
	reason string                   // why the proxy answered itself, or ""
	giveUp *ratecord.RateLimitError // when ratecord gave up
	err    error                    // why, not yet redacted

	refusedTarget bool // the request target was refused: do not log it

	fwd forwarding // what forwarding the request needs
}

func (rec *recorder) WriteHeader(code int) {
	if rec.status == 0 && code >= 200 {
		rec.status = code
	}
	rec.ResponseWriter.WriteHeader(code)
}

func (rec *recorder) Write(b []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	n, err := rec.ResponseWriter.Write(b)
	rec.bytes += int64(n)
	return n, err
}

// Unwrap lets [http.ResponseController] reach the connection's writer.
func (rec *recorder) Unwrap() http.ResponseWriter { return rec.ResponseWriter }
