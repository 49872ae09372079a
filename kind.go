package ratecord

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
)

// kindRename is the claim kind (see [store.Claim].Kind) of a channel edit
// that changes the channel's name or topic: Discord allows 2 per 10
// minutes, a sublimit inside the channel-edit bucket that no header shows.
const kindRename = "rename"

// routeChannelEdit is the route whose body decides its kind.
const routeChannelEdit = "PATCH /channels/:id"

// maxPeek bounds how much of a request body is read to tell its kind.
const maxPeek = 16 << 10

// kindOf returns the kind of req on route (see [store.Claim].Kind), "" for
// a request no hidden sublimit narrower than its route concerns. It reads
// the body only for a route whose body decides, and at most maxPeek bytes
// of it: through GetBody when req has one, else from req.Body itself, and
// then returns in body what to send instead (the bytes read, then the
// rest); the caller must not use req.Body any more. A body that ends
// before its kind is known counts as a rename, the kind that waits more.
// The body is never logged.
func kindOf(req *http.Request, route string) (kind string, body io.ReadCloser) {
	if route != routeChannelEdit || req.Body == nil || req.Body == http.NoBody {
		return "", nil
	}
	var src io.Reader
	if req.GetBody != nil {
		rc, err := req.GetBody()
		if err != nil {
			return kindRename, nil
		}
		defer rc.Close()
		src = rc
	} else {
		src = req.Body
	}
	peek, err := io.ReadAll(io.LimitReader(src, maxPeek+1))
	if req.GetBody == nil {
		body = readCloser{io.MultiReader(bytes.NewReader(peek), req.Body), req.Body}
	}
	if err != nil || len(peek) > maxPeek {
		return kindRename, body
	}
	if renames(peek) {
		return kindRename, body
	}
	return "", body
}

// renames reports whether b, a whole JSON body of a channel edit, names
// name or topic at its top level. A body that is not a JSON object does not
// (Discord refuses it).
func renames(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return false
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if k, _ := tok.(string); k == "name" || k == "topic" {
			return true
		}
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return false
		}
	}
	return false
}
