package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
)

// send forwards a checked request upstream through ratecord's Transport and
// copies the answer back. It does what httputil.ReverseProxy with
// [proxy.rewrite] does, with less work per request: no clone of the whole
// request, one header map built while leaving out what must not pass, the
// response's header values handed over rather than added one at a time,
// no media type parsed, no flush timer, and the request's own state in the
// recorder's allocation. What it does, as the reverse proxy does it:
//
//   - hop-by-hop headers are removed both ways: those the Connection header
//     names and Connection, Proxy-Connection, Keep-Alive,
//     Proxy-Authenticate, Proxy-Authorization, TE, Trailer,
//     Transfer-Encoding and Upgrade; TE: trailers passes when the client
//     sent it;
//   - Forwarded and X-Forwarded-For, -Host and -Proto are removed and none
//     is added; so is the client secret;
//   - no User-Agent is added where the client sent none;
//   - the query is passed as sent, or re-encoded when it has a ";" or a
//     malformed escape, so that the upstream reads the parameters this
//     proxy would;
//   - a body of unknown length streams both ways, flushed as it comes, as
//     are server-sent events; trailers pass both ways; informational (1xx)
//     responses are passed on;
//   - the client's going away cancels the upstream request (the request's
//     context) until the request is written upstream; once it is, the
//     request counts at Discord, and the Transport reads its response for
//     its limits (see ratecord.Transport.RoundTrip); a response body that
//     breaks off aborts the client's connection, so that the client sees
//     it cut rather than complete.
//
// One thing it does better: a request's trailers reach the upstream with
// their values, where the reverse proxy sends a copy of the trailer map
// taken before the body was read, and so the names alone.
//
// A request asking to switch protocols (an Upgrade header) is handed to the
// reverse proxy itself, which handles it as it always has.
func (p *proxy) send(rec *recorder, r *http.Request) {
	if _, ok := r.Header["Upgrade"]; ok {
		p.rp.ServeHTTP(rec, r)
		return
	}
	f := &rec.fwd
	f.w = rec
	res, err := p.transport.RoundTrip(p.outgoing(r, f))
	f.mu.Lock()
	f.done = true // no 1xx from now on: the final response's headers are next
	f.mu.Unlock()
	if f.body.r != nil {
		// The transport may still read the body after an error, or for
		// a response that came before the whole body was sent: only until
		// this handler returns.
		defer f.body.Close()
	}
	if err != nil {
		p.handleError(rec, r, err)
		return
	}
	if res.StatusCode == http.StatusSwitchingProtocols {
		res.Body.Close()
		p.handleError(rec, r, errUnrequestedUpgrade)
		return
	}
	removeHopByHop(res.Header)
	h := rec.Header()
	addHeader(h, res.Header)
	announced := len(res.Trailer)
	if announced > 0 {
		names := make([]string, 0, len(res.Trailer))
		for k := range res.Trailer {
			names = append(names, k)
		}
		h.Add("Trailer", strings.Join(names, ", "))
	}
	rec.WriteHeader(res.StatusCode)

	if err := p.copyBody(rec, r, res); err != nil {
		res.Body.Close()
		// The client has the status and part of the body: only cutting
		// the connection tells it the body is not whole.
		panic(http.ErrAbortHandler)
	}
	res.Body.Close() // fills res.Trailer
	if len(res.Trailer) > 0 {
		// Chunked, so that the trailers can follow the body.
		http.NewResponseController(rec).Flush()
	}
	if len(res.Trailer) == announced {
		addHeader(h, res.Trailer)
		return
	}
	for k, vv := range res.Trailer {
		for _, v := range vv {
			h.Add(http.TrailerPrefix+k, v)
		}
	}
}

// errUnrequestedUpgrade is the error of an upstream that switched protocols
// unasked.
var errUnrequestedUpgrade = errors.New("the upstream switched protocols though the request asked for no switch")

// outgoing returns the request to send upstream for r: r's method, checked
// path and query, headers and body, aimed at the upstream, in r's context
// (so that the client's going away ends it) with f's trace of
// informational responses.
func (p *proxy) outgoing(r *http.Request, f *forwarding) *http.Request {
	f.trace.Got1xxResponse = f.got1xx
	out := r.WithContext(httptrace.WithClientTrace(r.Context(), &f.trace)) // a shallow copy
	u := &f.url
	*u = url.URL{Scheme: p.cfg.upstream.Scheme, Host: p.cfg.upstream.Host, RawQuery: p.upstreamQuery(r.URL.RawQuery)}
	// The path was checked decoded: send it encoded the one way Go
	// encodes it, rather than as the client spelled it.
	u.Path, u.RawPath = joinPath(p.cfg.upstream, r.URL.Path)
	out.URL = u
	out.Host = ""
	out.Close = false
	out.RequestURI = ""
	out.Header = p.outgoingHeader(r)
	switch {
	case r.ContentLength == 0:
		out.Body, out.GetBody = nil, nil // nil, so that http.Transport may retry on a new connection
	case r.GetBody == nil && r.Body != nil:
		// A streamed body: the transport closes what it is given, but the
		// server's body is the server's to close.
		f.body.r = r.Body
		out.Body = &f.body
	}
	return out
}

// outgoingHeader returns the headers to send upstream: r's, less the
// hop-by-hop, forwarding and client authentication headers, with TE:
// trailers if the client sent it, an empty User-Agent if it sent none (so
// that Go's is not added), and the default token where one is allowed. The
// values are r's own: nothing changes them.
func (p *proxy) outgoingHeader(r *http.Request) http.Header {
	in := r.Header
	h := make(http.Header, len(in)+1)
	for k, vv := range in {
		if !dropOutgoing(k) {
			h[k] = vv
		}
	}
	for _, v := range in["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				delete(h, http.CanonicalHeaderKey(name))
			}
		}
	}
	if hasToken(in["Te"], "trailers") {
		h["Te"] = []string{"trailers"}
	}
	if _, ok := h["User-Agent"]; !ok {
		h["User-Agent"] = emptyValue
	}
	if p.authValue != nil {
		if a := h["Authorization"]; (len(a) == 0 || a[0] == "") && !tokenInPath(r.URL.Path) {
			h["Authorization"] = p.authValue
		}
	}
	return h
}

// addHeader adds the values of src to dst. A name dst lacks gets src's
// values themselves: nothing changes them afterwards.
func addHeader(dst, src http.Header) {
	for k, vv := range src {
		if old := dst[k]; len(old) > 0 {
			dst[k] = append(old, vv...)
		} else {
			dst[k] = vv
		}
	}
}

// emptyValue is the value of a header sent empty, which http.Transport
// then leaves out.
var emptyValue = []string{""}

// dropOutgoing reports whether a request header must not be sent upstream.
func dropOutgoing(name string) bool {
	switch name {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto",
		hdrClientSecret:
		return true
	}
	return false
}

// removeHopByHop removes the hop-by-hop headers of a response: those its
// Connection header names, and the standard ones.
func removeHopByHop(h http.Header) {
	for _, v := range h["Connection"] {
		for name := range strings.SplitSeq(v, ",") {
			if name = textproto.TrimString(name); name != "" {
				delete(h, http.CanonicalHeaderKey(name))
			}
		}
	}
	for k := range h {
		switch k {
		case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
			"Te", "Trailer", "Transfer-Encoding", "Upgrade":
			delete(h, k)
		}
	}
}

// hasToken reports whether a comma-separated header holds token, without
// regard to case.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for t := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(textproto.TrimString(t), token) {
				return true
			}
		}
	}
	return false
}

// joinPath returns the upstream's path followed by path, and the raw path
// to send when the upstream's own path has escapes.
func joinPath(up *url.URL, path string) (string, string) {
	if up.RawPath == "" {
		return joinSlash(up.Path, path), ""
	}
	ref := url.URL{Path: path}
	return joinSlash(up.Path, path), joinSlash(up.EscapedPath(), ref.EscapedPath())
}

func joinSlash(a, b string) string {
	if a == "" || a == "/" {
		return b
	}
	aslash, bslash := strings.HasSuffix(a, "/"), strings.HasPrefix(b, "/")
	switch {
	case aslash && bslash:
		return a + b[1:]
	case !aslash && !bslash:
		return a + "/" + b
	}
	return a + b
}

// upstreamQuery returns the query to send: the upstream's, then the
// client's, cleaned by [cleanQuery].
func (p *proxy) upstreamQuery(q string) string {
	q = cleanQuery(q)
	switch up := p.cfg.upstream.RawQuery; {
	case up == "":
		return q
	case q == "":
		return up
	default:
		return up + "&" + q
	}
}

// maxQueryParams is the most query parameters passed as sent.
const maxQueryParams = 10000

// cleanQuery returns a query as sent, or, when it has a ";", a malformed
// escape or more than maxQueryParams parameters, as Go parses it, so that
// no server after this one reads parameters this one would not.
func cleanQuery(q string) string {
	if strings.Count(q, "&")+1 > maxQueryParams {
		return reencodeQuery(q)
	}
	for i := 0; i < len(q); {
		switch q[i] {
		case ';':
			return reencodeQuery(q)
		case '%':
			if i+2 >= len(q) || !isHex(q[i+1]) || !isHex(q[i+2]) {
				return reencodeQuery(q)
			}
			i += 3
		default:
			i++
		}
	}
	return q
}

func reencodeQuery(q string) string {
	v, _ := url.ParseQuery(q)
	return v.Encode()
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// streaming reports whether a response's body is passed on as it comes,
// flushed after every read: a body of unknown length, or server-sent
// events.
func streaming(res *http.Response) bool {
	if res.ContentLength == -1 {
		return true
	}
	ct, _, _ := strings.Cut(res.Header.Get("Content-Type"), ";")
	return strings.EqualFold(strings.TrimSpace(ct), "text/event-stream")
}

// copyBody copies the response body to the client through a pooled
// buffer; a body of unknown length and server-sent events are flushed after
// every read (and the headers at once). It returns the first error of
// either side.
func (p *proxy) copyBody(rec *recorder, r *http.Request, res *http.Response) error {
	var rc *http.ResponseController
	if streaming(res) {
		rc = http.NewResponseController(rec)
		rc.Flush()
	}
	bp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bp)
	buf := *bp
	for {
		n, rerr := res.Body.Read(buf)
		if n > 0 {
			if _, werr := rec.Write(buf[:n]); werr != nil {
				return werr
			}
			if rc != nil {
				rc.Flush()
			}
		}
		switch {
		case rerr == io.EOF:
			return nil
		case rerr != nil:
			if rerr != context.Canceled {
				p.log.LogAttrs(r.Context(), slog.LevelWarn, "the upstream's response body broke off",
					slog.String("path", redactPath(r.URL)), slog.String("error", p.redactError(rerr, r)))
			}
			return rerr
		}
	}
}

// copyBuffers holds the buffers response bodies are copied through.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 8<<10); return &b }}

// forwarding is what one forwarded request needs besides the outgoing
// request: its URL, the wrapper of a streamed body, and the trace that
// passes informational responses on. It is part of the request's recorder,
// so as to cost no allocation of its own.
type forwarding struct {
	url   url.URL
	body  requestBody
	trace httptrace.ClientTrace

	w    http.ResponseWriter
	mu   sync.Mutex // guards done, and w's headers while a 1xx is written
	done bool       // the final response is in: no more 1xx is passed on
}

// got1xx passes an informational response on to the client, unless the
// final response is in.
func (f *forwarding) got1xx(code int, header textproto.MIMEHeader) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done {
		return nil
	}
	h := f.w.Header()
	addHeader(h, http.Header(header))
	f.w.WriteHeader(code)
	clear(h) // WriteHeader does not clear them after a 1xx
	return nil
}

// requestBody is a streamed request body as the transport sees it: closing
// it leaves the server's body open, and reading it after the handler has
// closed it fails.
type requestBody struct {
	r      io.ReadCloser
	closed atomic.Bool
}

var errBodyClosed = errors.New("ratecord proxy: read of a request body after its handler returned")

func (b *requestBody) Read(p []byte) (int, error) {
	if b.closed.Load() {
		return 0, errBodyClosed
	}
	return b.r.Read(p)
}

func (b *requestBody) Close() error {
	b.closed.Store(true)
	return nil
}
