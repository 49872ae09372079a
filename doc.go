// Package ratecord keeps Discord bots inside Discord's REST rate limits.
//
// A [Transport] is an [http.RoundTripper]: set it as an [http.Client]'s
// Transport, or hand such a client to any Discord library that accepts one,
// and every request made through it waits for its turn instead of earning a
// 429:
//
//	client := &http.Client{Transport: ratecord.NewTransport(nil)}
//
// For every request the transport
//
//  1. computes the route key: the method, the route template (ids become
//     ":id", tokens ":token"), the major parameter (channel, guild, webhook
//     or interaction) and a keyed hash of the Authorization header;
//  2. claims a slot from the store, waiting in arrival order while the
//     bucket, the credential's global limit, or a pause ordered by a 429
//     says so, and failing fast with a [*RateLimitError] when the wait would
//     pass [WithMaxWait] or the moment the request must leave to come back
//     by its deadline: the deadline less the transport's smoothed round
//     trip (40 ms until its first response);
//  3. sends the request through the wrapped transport, unless its deadline
//     now leaves less than that round trip: its slot then goes back, and it
//     fails with [context.DeadlineExceeded] rather than be counted by
//     Discord and cancelled on its way;
//  4. reports the response's rate-limit headers and 429 body to the store;
//  5. sends a 429 again through a new claim, which waits exactly as long as
//     Discord asked, and retries 5xx responses and network errors of
//     idempotent requests with back-off.
//
// # Buckets
//
// Discord names the counter a route uses in X-RateLimit-Bucket. Until a
// route's first response names it, the route sends one request at a time;
// from then on requests of every route that shares the hash share one
// counter per major parameter, and go out concurrently while the counter has
// requests left. Remaining counts are decremented when a slot is granted and
// only ever lowered by responses; resets come from X-RateLimit-Reset-After
// plus a safety offset, never from wall clocks (of a fixed window's
// responses, the one that came back fastest dates its end), and a window
// reopens keeping a slot for each request granted in it still in flight,
// which may arrive at Discord in the next one. This is correct for
// Discord's fixed and sliding windows alike. A sliding window gives its
// slots back one at a time; the store tells it from a fixed one by comparing
// responses' X-RateLimit-Reset with each other (Discord's clock, never the
// local one), and counts each request in flight as a whole slot until its
// response dates it, since Discord counts a request from when it arrives,
// or, unreported, a little past the hold after its grant
// ([store.Policy].GlobalHold), by which it has surely arrived: then it
// drains from the hold on, so a process stopped with requests in flight
// holds a sliding window for half a second, not until it runs again.
//
// A 429 of scope shared limits a resource every client shares, not the
// bucket: the store holds that resource alone (the request's path on its
// route: one message's reactions, say) for the wait the 429 names, in every
// process of a shared store, and the route's other resources keep their
// bucket's rate.
//
// # Limits no header announces
//
// The transport waits exactly as long as Discord said, for exactly what it
// said it about; where it said nothing, it learns from what passed. A 429
// without rate-limit headers whose Retry-After names its wait (an empty or
// JSON body) is a wait of that length on the request's bucket. A 429
// without rate-limit headers and without any wait comes from Cloudflare,
// which counts per IP address: the store holds its route for
// every credential, in every process of a shared store, for a pause of at
// least a second ([WithBlockPause]), then lets one probe through at a time,
// the probes going when the block has lasted one, two, four... pauses. A
// ban page, any header-less 429 whose body is not JSON (Discord's API
// answers JSON), or blocks on two routes, hold every route. Nothing is
// resent in a loop. A block also says the route went past a limit, so once it ends the route
// is paced: each process lets out at most nine tenths of what passed for
// it in the second before the block (counting the answers that came just
// after it), evenly spaced, for ten minutes; the tenth kept back is room
// for the network's jitter. A block of every route paces the route whose
// request, of those it answered, was sent first. Like TCP's congestion
// control, the pace probes upward: one request more per second after each
// 5 s it ran clean while holding requests back, up to nine tenths of the
// rate the edge last refused, and past that after 30 s clean; a block
// after such a raise sets it back to the rate that ran clean and doubles
// the time to the next, a block soon after the pace was set takes a tenth
// off it, and one at a rate that had run clean halves it.
//
// Headers can overstate what Discord allows. A 429 of scope user from a
// bucket whose headers said requests remained, and whose own headers still
// claim room or say none is left in the same fixed window as a response
// that said some were, shows its real limit: each window of the bucket
// then grants what passed in the window that showed it (one more once a
// minute, to find a limit that rose), or, when nothing had passed yet, the
// bucket is held to one request in flight, each the spacing the 429
// revealed after the last response, until a response names another limit.
// Reaction routes start so held at Discord's stated 1 per 250 ms
// ([WithReactionSpacing]) while their headers describe a window longer
// than a second; shorter windows are taken at their word. A hidden sublimit narrower than its route (2
// channel renames per 10 minutes) holds only the requests that can hit it:
// renames of that channel, told apart by their JSON body, while the
// channel's other edits go on. A request sent again after its 429 keeps its
// place in line ahead of those that queued behind it.
//
// # Stores
//
// State lives in a store.Store. Without [WithStore] the transport uses an
// in-memory store (package store/memstore) for one process; the Redis store
// shares limits between processes. What every request shares (the global
// limit, the invalid-request budget, cooldowns) is the store's policy, given
// when the store is built; a large bot's own global limit is given per bot
// ([WithBotGlobalLimit]) or found ([WithGlobalLimitDetection]).
//
// # Per request
//
// A request's context can carry its own maximum wait, down to "never wait"
// ([WithRequestMaxWait]), its retries ([WithRequestRetries]) and its lane
// ([WithRequestPriority]: urgent requests go ahead of bulk ones). A job
// system can ask when a request could go without sending it
// ([Transport.Estimate]).
//
// # Secrets
//
// Bot tokens, webhook tokens and interaction tokens never appear in keys,
// logs, errors or events: credentials and path tokens are replaced by keyed
// hashes ([WithHashKey]).
package ratecord
