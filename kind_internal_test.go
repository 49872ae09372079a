package ratecord

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestRenames(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"name":"general"}`, true},
		{`{"nsfw":true,"topic":"news"}`, true},
		{`{"nsfw":true,"rate_limit_per_user":5}`, false},
		{`{"permission_overwrites":[{"id":"1","name":"x"}],"position":2}`, false}, // name below the top level
		{`{"parent_id":"name","bitrate":64000}`, false},                           // name as a value
		{`{"nsfw":`, false},                                                       // malformed: Discord refuses it
		{`["name"]`, false},                                                       // not an object
		{`not json`, false},                                                       // not JSON
		{`{"a":{"name":1},"topic":null}`, true},
	} {
		if got := renames([]byte(tc.body)); got != tc.want {
			t.Errorf("renames(%q) = %v; want %v", tc.body, got, tc.want)
		}
	}
}

// onlyReader hides every method of its reader but Read, so that
// http.NewRequest sets no GetBody.
type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestKindOf(t *testing.T) {
	const edit = "PATCH /channels/:id"
	rename := `{"name":"general"}`
	for _, tc := range []struct {
		name, route, body string
		getBody           bool
		want              string
	}{
		{"rename, replayable body", edit, rename, true, kindRename},
		{"other edit, replayable body", edit, `{"nsfw":true}`, true, ""},
		{"rename, one-shot body", edit, rename, false, kindRename},
		{"other edit, one-shot body", edit, `{"nsfw":true}`, false, ""},
		{"a body too long to tell counts as a rename", edit, `{"nsfw":true,"x":"` + strings.Repeat("a", maxPeek) + `"}`, false, kindRename},
		{"another route is not read", "POST /channels/:id/messages", rename, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r io.Reader = strings.NewReader(tc.body)
			if !tc.getBody {
				r = onlyReader{r}
			}
			req, err := http.NewRequest("PATCH", "https://discord.test/api/v10/channels/1", r)
			if err != nil {
				t.Fatal(err)
			}
			kind, body := kindOf(req, tc.route)
			if kind != tc.want {
				t.Errorf("kindOf(%.40q) = %q; want %q", tc.body, kind, tc.want)
			}
			if wantBody := !tc.getBody && tc.route == edit; wantBody != (body != nil) {
				t.Fatalf("kindOf(%.40q) gave a body to send instead: %v; want one only for a one-shot body read", tc.body, body != nil)
			}
			send := req.Body
			if body != nil {
				send = body
			}
			got, err := io.ReadAll(send)
			if err != nil || !bytes.Equal(got, []byte(tc.body)) {
				t.Errorf("the body sent after kindOf = %.40q, %v; want the whole body %.40q", got, err, tc.body)
			}
		})
	}
}

// FuzzKindOf: telling a channel edit's kind never panics and never changes
// the body that is sent, whether or not the request can replay it.
func FuzzKindOf(f *testing.F) {
	f.Add([]byte(`{"name":"general"}`), false)
	f.Add([]byte(`{"nsfw":true,"permission_overwrites":[{"name":1}]}`), true)
	f.Add([]byte(`{"topic`), false)
	f.Fuzz(func(t *testing.T, b []byte, replayable bool) {
		var r io.Reader = bytes.NewReader(b)
		if !replayable {
			r = onlyReader{r}
		}
		req, err := http.NewRequest("PATCH", "https://discord.test/api/v10/channels/1", r)
		if err != nil {
			t.Fatal(err)
		}
		kind, body := kindOf(req, routeChannelEdit)
		if kind != "" && kind != kindRename {
			t.Fatalf("kindOf(%q) = %q; want %q or none", b, kind, kindRename)
		}
		send := req.Body
		if body != nil {
			send = body
		}
		if got, err := io.ReadAll(send); err != nil || !bytes.Equal(got, b) {
			t.Fatalf("the body sent after kindOf(%q) = %q, %v; want it whole", b, got, err)
		}
	})
}
