// Package discordtest emulates Discord's REST rate limits, in the style of
// [net/http/httptest]: [NewServer] starts an HTTP server on a loopback port
// that answers like Discord's API as far as rate limiting goes, so a client,
// a bot or a benchmark can be tested against it without touching Discord.
//
//	srv := discordtest.NewServer(discordtest.WithTimeScale(0.1))
//	defer srv.Close()
//	base := srv.URL() + "/api/v10" // point the bot's API base URL here
//
// The emulator implements what a client must get right:
//
//   - A bucket table maps route templates such as
//     "POST /channels/{channel_id}/messages" to bucket hashes, and hashes to a
//     limit and a window, fixed or sliding. Counters are kept per credential
//     (the Authorization header, or the client IP without one), bucket hash
//     and major parameter (channels/{id}, guilds/{id}, webhooks/{id}[/{token}],
//     interactions/{id}/{token}). Routes outside the table answer 200 without
//     rate-limit headers. See [DefaultBuckets], [DefaultRoutes],
//     [WithBuckets] and [WithRoutes].
//   - The global limit, 50 requests in any one second per credential by
//     default, with interaction callbacks and interaction webhooks exempt.
//   - GET /gateway/bot as Discord answers it (url, shards and
//     session_start_limit with total, remaining, reset_after and
//     max_concurrency), so a client can find a large bot's global limit
//     instead of being told: [WithMaxConcurrency] sets max_concurrency and
//     the global limit that goes with it ([GlobalLimitFor]: 50 per second
//     for 1, max(500, 25 × n) for more), [Server.SetMaxConcurrency] changes
//     both while the emulator runs. Without a token it answers 401.
//   - The headers exactly as Discord sends them: X-RateLimit-Limit,
//     -Remaining, -Reset, -Reset-After and -Bucket on every response of a
//     route in the table, Date and Via on every response but a ban; on a 429
//     a JSON body with retry_after in seconds, Retry-After rounded up to whole
//     seconds, X-RateLimit-Scope and, for global ones, X-RateLimit-Global
//     (and then no bucket headers). Durations are rounded up to the
//     millisecond. The milliseconds of API versions before v8 are not
//     emulated: every prefix gets seconds.
//   - What headers do not say: the hidden sublimit on renaming a channel
//     ([WithHiddenSublimit]), busy resources answering 429 with scope shared
//     ([WithSharedLimit]), top-level or within one, such as each message of
//     a channel, an X-RateLimit-Limit that understates or overstates the
//     real limit ([Bucket].Announced), headers that claim room a bucket does
//     not have ([Bucket].Claim), a limit of a route whose 429s carry
//     nothing but Retry-After in whole seconds, no rate-limit header and no
//     body ([WithBareLimit]), a limit of Discord's edge per client IP whose
//     429s carry no rate-limit headers (Cloudflare's JSON, or a body such as
//     a plain "Too Many Requests") and either block the IP for a while, on
//     the limit's routes or on every route, with a ban for hammering a
//     block, or refuse the requests over the limit one by one
//     ([WithEdgeLimit]), and a server clock that disagrees with the
//     client's ([WithClockSkew]).
//   - Invalid requests (401, 403, 429 except scope shared, 404 from a
//     webhook) counted per client IP, and a Cloudflare ban above the
//     threshold: 429 with an HTML body ("error code: 1015"), no rate-limit
//     headers, no Via and no Retry-After ([WithInvalidRequestLimit],
//     [WithBanDuration]).
//   - 401 for unknown tokens ([WithTokens], [WithInvalidTokens]) and 404 for
//     deleted channels and webhooks ([WithDeletedChannels],
//     [Server.DeleteChannel]).
//
// A scenario can change while it runs: [Server.SetBucket] changes a bucket's
// limit or window, [Server.MoveRoute] moves a route to another bucket.
// [WithNetwork] adds network latency: a way up, after which the request
// counts, and a way down, before the response is written, each with jitter
// and rare stalls, so requests arrive out of order and responses overtake
// each other ([NetworkProfile] names a LAN, a bot host's distance from
// Discord, and one with stalls; [WithSeed] makes the draws repeatable). A
// response whose client gives up on the way down is written to no one and
// tells the client nothing; a request whose client gives up on the way up
// is dropped, or with [WithSentRequestsArrive] arrives all the same.
// [WithTimeScale] runs every window faster or slower; headers then report
// real seconds, so a client needs no change to run in fast-forward.
//
// [Server.Stats] reports what happened: requests by status, 429s by scope,
// 429s a correct client would have avoided kept apart from those it could
// not, bans, successes per bucket, and a log of recent requests with tokens
// redacted.
//
// A 429 counts as avoidable only when the client could have known it was
// coming: a response that told it so had reached the process that sent the
// request at least a millisecond before the request was sent, or another
// process of the same client (the same credential; for an edge limit, the
// same client IP) at least 5 ms before, the time a bot's processes are given
// to share what they learn, through Redis say ([WithPropagation] changes
// it). A client names its processes with the [ProcessHeader] request header;
// requests without it are one process per client IP. A client on the
// emulator's host may date each request with [SentHeader], so that a busy
// host's delay in starting the emulator's handler counts as network time,
// not as time the client had to learn. See [Stats] for the rule of each
// limit.
//
// The emulator listens only on loopback addresses. Its memory is bounded: a
// counter that has fully reset is dropped.
package discordtest
