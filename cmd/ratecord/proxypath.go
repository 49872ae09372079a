package main

import (
	"net/url"
	"strings"
	"unicode/utf8"

	"github.com/ratecord/ratecord"
)

// targetError says why a request target was refused. Its text is safe to
// log and to send back: it never quotes the target.
type targetError struct{ msg string }

func (e *targetError) Error() string { return e.msg }

// Reasons a request target is refused.
var (
	errNotOriginForm  = &targetError{"the request target must be a path (absolute-form and authority-form are not forwarded)"}
	errBadEscape      = &targetError{"the path has an invalid percent-encoding"}
	errEncodedSlash   = &targetError{"the path has an encoded slash"}
	errDoubleEncoded  = &targetError{"the path has an encoded percent sign"}
	errControlByte    = &targetError{"the path has a control byte or a space"}
	errBadByte        = &targetError{`the path has a backslash, ";", or an encoded "?" or "#"`}
	errNonASCII       = &targetError{"the path has non-ASCII bytes outside a reaction's emoji"}
	errBadUTF8        = &targetError{"the path is not valid UTF-8"}
	errConfusable     = &targetError{"the emoji segment has a character that normalises to a dot or a slash"}
	errDotSegment     = &targetError{"the path has a dot-segment"}
	errEmptySegment   = &targetError{"the path has an empty segment"}
	errNotAPI         = &targetError{"only /api/... is forwarded"}
	errTargetMismatch = &targetError{"the path could not be read unambiguously"}
)

// checkTarget checks a request target (the request line's URI) before
// anything else reads it, and returns its path, percent-decoded. It accepts
// only an origin-form target ("/..." and an optional query) whose decoded
// path
//
//   - has no dot-segment ("." or "..", or any segment made only of dots),
//     however it was encoded;
//   - has no encoded slash ("%2F"), no encoded percent sign ("%25", which
//     a second decoding could turn into anything), no backslash, no ";"
//     (path parameters, which some servers strip from a segment), no
//     encoded "?" or "#", and no control byte or space;
//   - has no empty segment but an optional trailing one ("//" collapses in
//     some servers, moving every segment after it);
//   - is ASCII except in the segment after "reactions", the emoji, which
//     must be valid UTF-8 without characters that Unicode normalisation
//     turns into dots or slashes.
//
// So the decoded path is a fixed point of percent-decoding, and every
// server on the way sees the segments this proxy saw. Whether the path is
// an API path is for [isAPIPath].
func checkTarget(uri string) (string, error) {
	if uri == "" || uri[0] != '/' {
		return "", errNotOriginForm
	}
	raw, _, _ := strings.Cut(uri, "?")
	for i := 0; i+2 < len(raw); i++ {
		if raw[i] == '%' && raw[i+1] == '2' && (raw[i+2] == 'f' || raw[i+2] == 'F') {
			return "", errEncodedSlash
		}
	}
	path, err := url.PathUnescape(raw)
	if err != nil {
		return "", errBadEscape
	}
	// Segment by segment: every segment but the first (before the leading
	// slash) and a trailing empty one.
	var prev string
	rest := path[1:]
	for {
		seg, after, more := strings.Cut(rest, "/")
		if err := checkSegment(seg, prev, more); err != nil {
			return "", err
		}
		if !more {
			break
		}
		prev, rest = seg, after
	}
	return path, nil
}

// checkSegment checks one decoded path segment; prev is the segment before
// it and more says whether another follows.
func checkSegment(seg, prev string, more bool) error {
	if seg == "" {
		if more {
			return errEmptySegment
		}
		return nil // a trailing slash
	}
	dots, ascii := true, true
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		switch {
		case c <= ' ' || c == 0x7f:
			return errControlByte
		case c == '%':
			return errDoubleEncoded
		case c == '\\' || c == ';' || c == '?' || c == '#':
			return errBadByte
		case c >= utf8.RuneSelf:
			ascii = false
		}
		dots = dots && c == '.'
	}
	if dots {
		return errDotSegment
	}
	if ascii {
		return nil
	}
	if !strings.EqualFold(prev, "reactions") {
		return errNonASCII
	}
	if !utf8.ValidString(seg) {
		return errBadUTF8
	}
	for _, r := range seg {
		if confusable(r) {
			return errConfusable
		}
	}
	return nil
}

// confusable reports whether Unicode compatibility normalisation (NFKC)
// turns r into a dot or a slash, so that a server normalising the path
// could see a dot-segment or a new segment.
func confusable(r rune) bool {
	switch r {
	case '\u2024', // ONE DOT LEADER
		'\u2025', // TWO DOT LEADER
		'\u2026', // HORIZONTAL ELLIPSIS
		'\uFE52', // SMALL FULL STOP
		'\uFF0E', // FULLWIDTH FULL STOP
		'\uFF0F', // FULLWIDTH SOLIDUS
		'\uFE68', // SMALL REVERSE SOLIDUS
		'\uFF3C': // FULLWIDTH REVERSE SOLIDUS
		return true
	}
	return false
}

// isAPIPath reports whether a path checked by [checkTarget] names
// something under /api/: "/api/" and an optional version segment ("v10")
// followed by at least one more segment.
func isAPIPath(path string) bool {
	if !strings.HasPrefix(path, "/api/") {
		return false
	}
	route := ratecord.TrimAPIPrefix(path)
	return len(route) > 1 && route[1] != '/'
}

// tokenInPath reports whether an API path authenticates with a token in
// the path: webhooks/{id}/{token}... and interactions/{id}/{token}/....
// Such requests must not carry the bot's token. ratecord's route grammar
// decides, matching the route words without case, so that a server that
// ignores case cannot see a webhook route where this proxy saw none.
func tokenInPath(path string) bool {
	_, _, ok := ratecord.PathToken(path)
	return ok
}
