package main

import (
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// The log line of a request answered from upstream is the one written most
// often, and slog spends a good part of its time on it formatting the
// duration through encoding/json. The proxy writes that line itself when
// the log is JSON, byte for byte as slog's JSONHandler would (a test holds
// the two together); every other line goes through slog.

// writeRequestLine writes the log line of a request the upstream answered
// (no reason, error or give-up to report) to w, and reports whether it did:
// it does not when a string would need escaping, and the caller then logs
// through slog.
func writeRequestLine(w io.Writer, t time.Time, method, path string, status int, d time.Duration, n int64) bool {
	if !plainJSON(method) || !plainJSON(path) {
		return false
	}
	bp := lineBuffers.Get().(*[]byte)
	defer lineBuffers.Put(bp)
	b := appendRequestLine((*bp)[:0], t, method, path, status, d, n)
	*bp = b
	w.Write(b)
	return true
}

// appendRequestLine appends the line to b. method and path must pass
// plainJSON.
func appendRequestLine(b []byte, t time.Time, method, path string, status int, d time.Duration, n int64) []byte {
	b = append(b, `{"time":"`...)
	b = t.Round(0).AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","level":"INFO","msg":"request","method":"`...)
	b = append(b, method...)
	b = append(b, `","path":"`...)
	b = append(b, path...)
	b = append(b, `","status":`...)
	b = strconv.AppendInt(b, int64(status), 10)
	b = append(b, `,"duration_ms":`...)
	// What encoding/json writes for a float64 from 1e-6 up to 1e21, and
	// for 0: a duration in whole microseconds is one or the other.
	b = strconv.AppendFloat(b, durationMS(d), 'f', -1, 64)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, n, 10)
	b = append(b, "}\n"...)
	return b
}

// durationMS is a request's duration as logged: milliseconds, to the
// microsecond.
func durationMS(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// plainJSON reports whether s goes into a JSON string as it is: printable
// ASCII other than the quote and the backslash.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// lineBuffers holds the buffers log lines are formatted in.
var lineBuffers = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// fastLog reports whether the request's line may be written by
// writeRequestLine: the log is JSON and there is nothing but the answer to
// report.
func (p *proxy) fastLog(rec *recorder) bool {
	return p.lines != nil && rec.reason == "" && rec.giveUp == nil && rec.err == nil && !rec.refusedTarget
}

// logAnswered writes the line of a request the upstream answered, if
// writeRequestLine can.
func (p *proxy) logAnswered(r *http.Request, rec *recorder, d time.Duration) bool {
	return writeRequestLine(p.lines, time.Now(), r.Method, redactPath(r.URL), rec.status, d, rec.bytes)
}
