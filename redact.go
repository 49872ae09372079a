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
