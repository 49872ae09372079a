package discordtest

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
)

// banPage is the body of a Cloudflare ban, as Discord's edge sends it.
const banPage = `<!DOCTYPE html>
<html>
<head><title>Access denied | discord.com used Cloudflare to restrict access</title></head>
<body>
<h1>Error 1015</h1>
<p>You are being rate limited.</p>
<p>error code: 1015</p>
</body>
</html>
`

// botUserID is the ID of the user the emulator answers GET /users/@me with.
const botUserID = "1100000000000000001"

// respond writes the decision as Discord's response.
func (s *Server) respond(w http.ResponseWriter, q *request, res result) {
	h := w.Header()
	date := res.decided.Add(s.cfg.skew).UTC().Format(http.TimeFormat)
	if res.banned || res.edge {
		// Cloudflare's answers: no rate-limit headers, no Via.
		contentType, body := res.edgeBody.body()
		if res.banned {
			contentType, body = "text/html; charset=UTF-8", banPage
		}
		h.Set("Date", date)
		h.Set("Content-Type", contentType)
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, body)
		return
	}
	h.Set("Date", date)
	h.Set("Via", "1.1 google")
	if res.bare {
		// Retry-After and nothing else: no rate-limit headers, no body.
		h.Set("Retry-After", retryAfterHeader(res.retry))
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	if b := res.headers; b != nil {
		h.Set("X-RateLimit-Bucket", b.hash)
		h.Set("X-RateLimit-Limit", strconv.Itoa(b.limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(b.remaining))
		h.Set("X-RateLimit-Reset", formatEpoch(res.decided.Add(s.cfg.skew).Add(b.resetAfter)))
		h.Set("X-RateLimit-Reset-After", formatSeconds(b.resetAfter))
	}
	var body any
	switch res.status {
	case http.StatusTooManyRequests:
		h.Set("Retry-After", retryAfterHeader(res.retry))
		h.Set("X-RateLimit-Scope", res.scope)
		if res.scope == ScopeGlobal {
			h.Set("X-RateLimit-Global", "true")
		}
		body = rateLimited{
			Message:    "You are being rate limited.",
			RetryAfter: json.Number(formatSeconds(res.retry)),
			Global:     res.scope == ScopeGlobal,
		}
	case http.StatusUnauthorized, http.StatusNotFound:
		body = apiError{Message: res.message, Code: res.code}
	case http.StatusNoContent:
		w.WriteHeader(http.StatusNoContent)
		return
	default:
		body = s.successBody(q, res)
	}
	data, _ := json.Marshal(body) // plain structs and maps always marshal
	h.Set("Content-Type", "application/json")
	w.WriteHeader(res.status)
	_, _ = w.Write(data)
}

// rateLimited is the body of a 429.
type rateLimited struct {
	Message    string      `json:"message"`
	RetryAfter json.Number `json:"retry_after"`
	Global     bool        `json:"global"`
}

// apiError is the body of a 401 or 404.
type apiError struct {
	Message string `json:"message"`
	Code    int    `json:"code"`
}

// user is a Discord user object.
type user struct {
	ID            string  `json:"id"`
	Username      string  `json:"username"`
	Discriminator string  `json:"discriminator"`
	GlobalName    *string `json:"global_name"`
	Avatar        *string `json:"avatar"`
	Bot           bool    `json:"bot"`
	Flags         int     `json:"flags"`
}

// message is a Discord message object with the fields client libraries need.
type message struct {
	ID              string   `json:"id"`
	Type            int      `json:"type"`
	ChannelID       string   `json:"channel_id"`
	WebhookID       string   `json:"webhook_id,omitempty"`
	Content         string   `json:"content"`
	Author          user     `json:"author"`
	Timestamp       string   `json:"timestamp"`
	EditedTimestamp *string  `json:"edited_timestamp"`
	TTS             bool     `json:"tts"`
	MentionEveryone bool     `json:"mention_everyone"`
	Mentions        []user   `json:"mentions"`
	MentionRoles    []string `json:"mention_roles"`
	Attachments     []any    `json:"attachments"`
	Embeds          []any    `json:"embeds"`
	Components      []any    `json:"components"`
	Pinned          bool     `json:"pinned"`
	Flags           int      `json:"flags"`
}

// channel is a Discord channel object.
type channel struct {
	ID   string `json:"id"`
	Type int    `json:"type"`
	Name string `json:"name"`
}

// successBody returns the JSON body of a 200.
func (s *Server) successBody(q *request, res result) any {
	segs := q.segs
	switch {
	case isGatewayBot(q):
		return newGatewayBot(res.gateway)
	case isGateway(q):
		return gateway{URL: gatewayURL}
	case res.hash == "":
		return struct{}{}
	}
	me := user{ID: botUserID, Username: "ratecord-emulator", Discriminator: "0", Bot: true}
	switch {
	case q.method == http.MethodGet && len(segs) == 2 && segs[0] == "users" && segs[1] == "@me":
		return me
	case q.method == http.MethodPost && len(segs) == 3 && segs[0] == "channels" && segs[2] == "messages":
		return newMessage(res, segs[1], "", q.content, me)
	case q.method == http.MethodPost && len(segs) == 3 && segs[0] == "webhooks":
		return newMessage(res, "0", segs[1], q.content, user{ID: segs[1], Username: "webhook", Discriminator: "0000", Bot: true})
	case q.method == http.MethodPatch && len(segs) == 2 && segs[0] == "channels":
		return channel{ID: segs[1], Type: 0, Name: "general"}
	}
	return struct{}{}
}

// newMessage builds a message object.
func newMessage(res result, channelID, webhookID, content string, author user) message {
	return message{
		ID:           res.id,
		ChannelID:    channelID,
		WebhookID:    webhookID,
		Content:      content,
		Author:       author,
		Timestamp:    res.decided.UTC().Format("2006-01-02T15:04:05.000000+00:00"),
		Mentions:     []user{},
		MentionRoles: []string{},
		Attachments:  []any{},
		Embeds:       []any{},
		Components:   []any{},
	}
}

// ceilMillis rounds d up to whole milliseconds; negative durations count as
// zero.
func ceilMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// formatSeconds formats d as seconds with three decimals, rounded up to the
// millisecond so a client never retries early: "0.250", "64.570".
func formatSeconds(d time.Duration) string {
	ms := ceilMillis(d)
	return formatMillis(ms)
}

// formatEpoch formats t as Unix epoch seconds with three decimals, rounded up
// to the millisecond.
func formatEpoch(t time.Time) string {
	ns := t.UnixNano()
	ms := ns / 1e6
	if ns%1e6 > 0 {
		ms++
	}
	return formatMillis(ms)
}

func formatMillis(ms int64) string {
	frac := strconv.FormatInt(ms%1000, 10)
	for len(frac) < 3 {
		frac = "0" + frac
	}
	return strconv.FormatInt(ms/1000, 10) + "." + frac
}

// retryAfterHeader formats the Retry-After header: whole seconds, rounded up.
func retryAfterHeader(d time.Duration) string {
	ms := ceilMillis(d)
	return strconv.FormatInt((ms+999)/1000, 10)
}
