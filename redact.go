package ratecord

import (
	"errors"
	"net/url"
	"strings"
)

// RedactError returns an error fit for logs: its message is err's with the
// secrets of every URL it quotes removed. Webhook and interaction tokens
// in a path are replaced by "REDACTED" as [RedactURL] finds them, and query
// strings, user information and fragments are dropped.
//
// It matters because [http.Client] wraps every error of a request,
// ratecord's [*RateLimitError] included, in a [*url.Error] whose message
// quotes the request's full URL: logging the error of a webhook or
// interaction request logs its token.
//
// The result wraps err rather than flattening it, so errors.Is and
// errors.As find through it what they find through err, and a *url.Error
// found through it holds the redacted URL. A *url.Error is returned as a
// new *url.Error, with URL and Err redacted, so that a type assertion to
// *url.Error still works. A nil err gives nil, and an err with nothing to
// redact is returned as it is. It is safe for concurrent use.
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	if ue, ok := err.(*url.Error); ok {
		red := &url.Error{Op: ue.Op, URL: redactURLText(ue.URL), Err: RedactError(ue.Err)}
		if red.URL == ue.URL && red.Err == ue.Err {
			return err
		}
		return red
	}
	msg := err.Error()
	red := redactText(msg)
	var ue *url.Error
	if red == msg && !errors.As(err, &ue) {
		return err
	}
	return &redactedError{msg: red, err: err}
}

// redactedError is an error with a redacted message that wraps the
// original.
type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }

func (e *redactedError) Unwrap() error { return e.err }

// As finds a *url.Error in the wrapped errors and sets target to a
// redacted copy of it, so that errors.As never hands out the full URL.
func (e *redactedError) As(target any) bool {
	t, ok := target.(**url.Error)
	if !ok {
		return false
	}
	var ue *url.Error
	if !errors.As(e.err, &ue) {
		return false
	}
	*t = RedactError(ue).(*url.Error)
	return true
}

// redactURLText redacts one URL (or path) given as text: [RedactURL]
// without the query. Text that does not parse as a URL could hold anything
// and is replaced as a whole.
func redactURLText(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return redacted
	}
	u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = "", false, "", ""
	return RedactURL(u)
}

// redactText redacts every URL, and every path, in a message: a word (up
// to a space, a quote or an angle bracket) that starts with "http://",
// "https://" or, after such a delimiter, "/". Punctuation that ends a
// sentence or a clause is kept out of the word.
func redactText(msg string) string {
	var b strings.Builder
	last := 0 // msg[:last] is in b or needs no change
	for i := 0; i < len(msg); i++ {
		if !urlStart(msg, i) {
			continue
		}
		end := i
		for end < len(msg) && !wordEnd(msg[end]) {
			end++
		}
		for end > i+1 && strings.IndexByte(".,;:)]}", msg[end-1]) >= 0 {
			end--
		}
		if red := redactURLText(msg[i:end]); red != msg[i:end] {
			b.WriteString(msg[last:i])
			b.WriteString(red)
			last = end
		}
		i = end
	}
	if last == 0 {
		return msg
	}
	b.WriteString(msg[last:])
	return b.String()
}

// urlStart reports whether a URL or a path starts at msg[i].
func urlStart(msg string, i int) bool {
	if i > 0 && !wordEnd(msg[i-1]) && msg[i-1] != '(' && msg[i-1] != '=' {
		return false
	}
	rest := msg[i:]
	if rest[0] == '/' {
		return true
	}
	for _, scheme := range [...]string{"http://", "https://"} {
		if len(rest) >= len(scheme) && strings.EqualFold(rest[:len(scheme)], scheme) {
			return true
		}
	}
	return false
}

// wordEnd reports whether c ends a URL in a message.
func wordEnd(c byte) bool {
	return c <= ' ' || c == '"' || c == '\'' || c == '`' || c == '<' || c == '>' || c == 0x7f
}

// redacted replaces secrets in URLs, logs and telemetry.
const redacted = "REDACTED"

// RedactURL returns u as a string fit for logs and telemetry. A nil u
// gives "". It is safe for concurrent use.
//
//   - In the path, the segments that may hold a secret are replaced by
//     "REDACTED": the webhook or interaction token of
//     webhooks/{id}/{token} and interactions/{id}/{token} (see
//     [PathToken]; the path may have a prefix before them), and any
//     segment of 40 bytes or more.
//   - In the query, a parameter keeps its name and a value that is an
//     integer or "true" or "false" (what Discord's parameters such as
//     wait, thread_id, limit and before take); any other value is replaced
//     by "REDACTED", and so is a parameter whose name is not a plain word
//     or is 40 bytes or more. A query string may carry anything a caller
//     put there, tokens and OAuth2 codes included.
//   - User information and the fragment are dropped.
//
// Use it to clean url.full in the spans of an instrumented base transport
// such as otelhttp, which records the URL as it is.
func RedactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	path := u.EscapedPath()
	var b strings.Builder
	b.Grow(len(u.Scheme) + 3 + len(u.Host) + len(path) + 1 + len(u.RawQuery))
	if u.Scheme != "" {
		b.WriteString(u.Scheme)
		b.WriteByte(':')
	}
	if u.Host != "" || u.Scheme != "" {
		b.WriteString("//")
		b.WriteString(u.Host)
	}
	// A webhooks or interactions segment after the first starts the
	// grammar again, so that the path of a URL under a prefix (a proxy's,
	// say) keeps its tokens too.
	last := 0             // path[:last] is written
	var before [2]segment // the two segments before seg
	for w := newSegments(path); ; {
		seg, ok := w.next()
		if !ok {
			break
		}
		if seg.secret() || seg.n > tokenIndex && isTokenRoot(before[0].text) && tokenAt(path[before[0].start-1:]) {
			b.WriteString(path[last:seg.start])
			b.WriteString(redacted)
			last = seg.end
		}
		before[0], before[1] = before[1], seg
	}
	b.WriteString(path[last:])
	if u.RawQuery != "" || u.ForceQuery {
		b.WriteByte('?')
		redactQuery(&b, u.RawQuery)
	}
	return b.String()
}

// tokenAt reports whether path holds a webhook or interaction token.
func tokenAt(path string) bool {
	_, _, ok := PathToken(path)
	return ok
}

// redactQuery writes a raw query string with the values that could hold a
// secret replaced, as [RedactURL] says.
func redactQuery(b *strings.Builder, query string) {
	for i := 0; query != ""; i++ {
		var param string
		param, query, _ = strings.Cut(query, "&")
		if i > 0 {
			b.WriteByte('&')
		}
		name, value, hasValue := strings.Cut(param, "=")
		if !plainWord(name) {
			b.WriteString(redacted)
			continue
		}
		b.WriteString(name)
		if !hasValue {
			continue
		}
		b.WriteByte('=')
		if plainValue(value) {
			b.WriteString(value)
		} else {
			b.WriteString(redacted)
		}
	}
}

// plainWord reports whether a query parameter's name is a word of the
// bytes route words are made of, too short to be a secret.
func plainWord(s string) bool {
	if len(s) >= minSecretLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !literalByte(s[i]) {
			return false
		}
	}
	return true
}

// plainValue reports whether a query value is one that cannot be a secret:
// empty, an integer (ids, limits) or a boolean.
func plainValue(s string) bool {
	switch s {
	case "", "true", "false":
		return true
	}
	if len(s) > maxIDLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		if byteClass[s[i]]&classDigit == 0 {
			return false
		}
	}
	return true
}
