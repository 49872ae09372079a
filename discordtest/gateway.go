package discordtest

import "net/http"

// gatewayURL is the URL GET /gateway and GET /gateway/bot report, Discord's
// own: the emulator serves no gateway.
const gatewayURL = "wss://gateway.discord.gg"

// sessionStartTotal is the daily number of session starts /gateway/bot
// reports, Discord's default.
const sessionStartTotal = 1000

// GlobalLimitFor returns the global limit, in requests per second, that goes
// with a gateway's session_start_limit.max_concurrency by the rule
// nirn-proxy follows: 50 for 1 (or less), max(500, 25 × n) for a larger n.
// It is the limit [WithMaxConcurrency] sets.
func GlobalLimitFor(maxConcurrency int) int {
	if maxConcurrency <= 1 {
		return 50
	}
	return max(500, 25*maxConcurrency)
}

// gateway is the body of GET /gateway.
type gateway struct {
	URL string `json:"url"`
}

// gatewayBot is the body of GET /gateway/bot.
type gatewayBot struct {
	URL               string            `json:"url"`
	Shards            int               `json:"shards"`
	SessionStartLimit sessionStartLimit `json:"session_start_limit"`
}

// sessionStartLimit is the session_start_limit object of GET /gateway/bot.
type sessionStartLimit struct {
	Total          int   `json:"total"`
	Remaining      int   `json:"remaining"`
	ResetAfter     int64 `json:"reset_after"` // milliseconds
	MaxConcurrency int   `json:"max_concurrency"`
}

// newGatewayBot returns the body of GET /gateway/bot for a bot whose gateway
// allows maxConcurrency session starts at once. The emulator starts no
// sessions, so the whole daily allowance remains and nothing is waiting to
// reset; the recommended shard count is maxConcurrency, the smallest count a
// bot of that size shards in.
func newGatewayBot(maxConcurrency int) gatewayBot {
	return gatewayBot{
		URL:    gatewayURL,
		Shards: maxConcurrency,
		SessionStartLimit: sessionStartLimit{
			Total:          sessionStartTotal,
			Remaining:      sessionStartTotal,
			ResetAfter:     0,
			MaxConcurrency: maxConcurrency,
		},
	}
}

// isGateway reports whether a request is GET /gateway.
func isGateway(q *request) bool {
	return q.method == http.MethodGet && len(q.segs) == 1 && q.segs[0] == "gateway"
}

// isGatewayBot reports whether a request is GET /gateway/bot.
func isGatewayBot(q *request) bool {
	return q.method == http.MethodGet && len(q.segs) == 2 && q.segs[0] == "gateway" && q.segs[1] == "bot"
}

// SetMaxConcurrency changes the max_concurrency GET /gateway/bot reports
// and sets the global limit that goes with it ([GlobalLimitFor]), taking
// effect for the next request, as Discord does when it raises a large bot's
// limits. Values below 1 count as 1.
func (s *Server) SetMaxConcurrency(n int) {
	n = max(1, n)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.maxConcurrency = n
	s.globalLimit = GlobalLimitFor(n)
}
