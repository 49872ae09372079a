// Package redisstore keeps ratecord's rate-limit state in Redis, so that
// every process and host of a bot shares one set of limits: N processes
// together send no more than one would.
//
// # Use
//
//	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	s := redisstore.New(client, redisstore.WithPrefix("mybot"))
//	defer s.Close()
//
// [New] accepts any [redis.UniversalClient]: a plain client, a ring or a
// cluster client. Every process that uses the same server and prefix shares
// the same limits. Redis 7 or later is required: the Store loads its Lua
// code once as a function library ([FUNCTION LOAD]) and calls it with
// FCALL, loading it again on a server that lost it (a restart, a new
// cluster node). Processes that share a prefix must run the same version
// of this package: the layout of the keys may change between versions.
//
// # Key layout
//
// All keys of one credential share one hash tag, the first 128 bits of the
// SHA-256 digest of the credential (itself a keyed hash of the token, never
// the token). So every call touches keys of one Redis Cluster slot, a
// claim is one atomic call over the bucket and the global window, and a
// cluster spreads credentials over its shards. With P the prefix and T the
// tag:
//
//	P:{T}:r        HASH   route template -> learned bucket hash ("\x00": no bucket); TTL 1 h after
//	                      last use, renewed once half of it has passed
//	P:{T}:c        HASH   gpause, unauth: deadlines of the global pause and of a 401 cooldown
//	                      (blocks are per IP, see P:{E}:e); gexp, rexp: until when the TTLs of
//	                      P:{T}:g and P:{T}:r were last set; glu: until when processes may wait
//	                      in the global window's line; pru: until when a probe (below) may be in
//	                      flight; TTL until the last of them + 1 s
//	P:{T}:g        ZSET   global window: permit id -> latest moment its request reached Discord
//	                      (grant + hold + 0.5 ms until it answers, then the response time,
//	                      earlier or later; a reserved grant lies in the future); TTL a minute
//	                      past its latest entry, set when that moves
//	P:{T}:d:<M>    STRING present while a token-authenticated major answered 401/404; TTL the cooldown
//	P:{T}:s:<K>    HASH   the claims of one kind (see store.Claim.Kind), which go one at a time
//	                      for every process, K a digest of (route, major, kind): until (a hidden
//	                      sublimit's 429 holds them until then), busy (one is out: its timeout),
//	                      w<S> (Store S waits for the one that is out); TTL until + retry_after,
//	                      and while one is out
//	P:{T}:b:<B>    STRING a counter's state in the rate-limit model, 35 packed doubles (see
//	                      model.lua); TTL until its reset, pause or pending permits' timeout + 10 min
//	P:{T}:m        HASH   digest of a major -> requests in flight on its routes whose bucket is
//	                      not known yet (probes: discounted when a bucket is learned, and a slot
//	                      kept for each in the known buckets of the major); the digest and "@" ->
//	                      when the last of them is overdue; TTL pending timeout
//	P:{T}:p:<S>    STRING what Redis knows of Store S: the number of its last call and of its
//	                      last report applied, and what each claim of that call was granted; TTL 1 h
//	P:{T}:w:<B>    ZSET   the line of counter B (or "g", the global window): tickets of the
//	                      processes waiting for it -> the moment each took its place (less 2^40
//	                      for an urgent ticket, so that those come first)
//	P:{T}:t:<B>    HASH   the same tickets -> "want|expiry|lane", and "_h": until when both
//	                      keys' TTLs were set; both TTL 10 minutes past the latest ticket
//	P:{G}:i        HASH   invalid responses of a group of processes per 10-second slot, G a
//	                      digest of the group ([WithInvalidGroup]); TTL 10 min 20 s
//	P:{E}:e        HASH   Cloudflare blocks of the group, E a digest of it: gate key (a route
//	                      template, or "*" for every route) -> "until|probe lease end|strikes|
//	                      probe id"; a gate lasts until a probe passes; TTL a day past the last
//	P:edge:<E>     channel notes of the group: the blocks changed ("b", the pause and the key
//	                      when a process met a block), the count of invalid responses crossed an
//	                      eighth of the budget ("i", the count, when its oldest stops counting),
//	                      a 429 of scope shared holds a resource ("s", the wait, a digest of the
//	                      credential, route and path, the Store's id)
//	P:n:<S>        channel pushes to Store S: "<T> <B> <ms>", its turn in a line of credential
//	                      T came or moved (see below)
//	P:n:!          channel recalls, to every Store: "<T> <B>", a response spent counter B of
//	                      credential T while it had grants out (a 429, a lowered limit);
//	                      "*" for B: a global 429 (see below)
//
// M is a digest of the major parameter, S the random id of a Store. B names a counter: "h" and a digest
// of (bucket hash, major) once the route's bucket is known, "r" and a
// digest of (route, major) for the probe of a route whose bucket is not
// known yet, "n" for the credential's routes without a bucket. Route
// templates and bucket hashes are stored as they are: neither contains a
// secret. Digests keep key names short and free of braces. Every key has a
// TTL, set when the key is created or its horizon moves, not on every call.
//
// # Whose clock
//
// The library's functions read the time with Redis TIME, and every
// deadline stored in Redis is a Redis time. Processes only ever send and
// receive durations (Reset-After, Retry-After, the offset, how long ago a
// response arrived, how long to wait), which they measure with their own
// monotonic clocks. Hosts whose wall clocks disagree by seconds therefore
// still agree on every window, and no deadline depends on which process
// wrote it. Relative TTLs alone could not express a window that refills
// only once its requests were reported, nor a sliding global window; one
// clock (the server's) can. Redis 7 replicates the effects of functions,
// not the functions' calls, so reading TIME is safe on replicas too.
//
// # One round trip for a credential
//
// A Store keeps a session per credential it serves: the queues of its
// waiters (a FIFO per route, major and kind, in two lanes), the reports of
// its responses that Redis has not applied yet, and what the last replies
// said about when to ask again. One goroutine, the session's driver, calls
// Redis for the credential, one call at a time: each call carries the
// reports gathered so far, in order, and the claims of every queue whose
// turn may have come, each for as many of its waiters as it has (up to
// [WithMaxBatch]) and, on a hot route no other process waits on, a few
// slots more (a lease, [WithLease]). So Redis traffic grows with neither
// the goroutines nor the routes: one call serves every queue of the
// credential, and a report rides on the next claim. A report nobody waits
// for waits up to 20 ms for one; a 429, a spent bucket, a limit lowered or
// a slot given back goes within a millisecond.
//
// A report says how long ago its response arrived: what a response says
// dates from its arrival, however long it waited to be sent.
//
// A session with nothing to do ends after a second, or after 50 ms while
// the Store holds more than 1,024 sessions; the Store also remembers each
// credential's routes (their hashes, windows and limits), a cache of what
// Redis holds, forgetting an entry 25 to 50 s after its last use and
// holding at most 65,536. So the memory a Store holds follows the credentials in use,
// not the credentials ever seen: a proxy relaying many users' tokens gives
// back the memory of those gone idle within a minute.
//
// # Waiting: told, not polled
//
// A refused claim learns until when it waits: a reset, a pause, the next
// drip of a sliding window, the next opening of the global window, or its
// turn in a line (below). Its process keeps that in memory: a waiter whose
// deadline or MaxWait comes before the end of a wait it knows, and a NoWait
// claim while one lasts, fail at once, and an estimate ([Store.Estimate])
// under one costs no command. Nobody asks again before it ends, unless
// told. The same holds for what a grant tells the waiters it leaves behind
// (the next slot after the one granted) and for the turn a push names:
// waiters that will not wait so long fail when they learn it, not at
// their deadlines.
//
// Across processes, a refused claim takes a ticket in the line of what
// refused it: its bucket's (per bucket and major) or the global window's.
// A line orders the processes waiting for a counter by the moment they
// took their place, urgent tickets first (a process holds one ticket per
// lane). Each ticket ahead of a claim keeps the slots it waits for; a
// turn takes an even share of the counter's window while others wait, at
// least four slots (or what it waits for, if less), so that a turn is
// worth its round trips; a ticket served in part goes to the back. So
// processes are served in arrival order within a window's slack, and none
// starves. A process holds a place only in the line of what it waits for:
// waiting for the global window while its bucket has room, it leaves the
// bucket's line, and waiting for the bucket, the global window's (where no
// other queue of the process needs that place); a place kept in the other
// line would keep slots from the holders behind that it cannot use. A
// ticket lives no longer than the waiters it holds for wait
// (their deadlines, MaxWait): a claim whose waiters are all gone before
// its turn can come (a fail-fast caller on a spent bucket) takes none, so
// no process is told a turn it can no longer use and gives it up, one
// call each, to the next. Callers that keep asking are the exception: a
// queue one of whose waiters left without a slot in the last second holds
// its place as a waiter without a bound would, and keeps a turn it is told
// while it has no waiter for the next one, until its callers stop asking
// (Redis keeps the turn's slots for it no longer than the ticket grace
// below); without a place, every process with such callers would claim
// whenever the bucket reopens. A ticket also expires when its holder does
// not claim it within [WithTicketGrace] of its expected turn, or of a push
// that told it its turn had come;
// a process waiting behind it looks again then, if sooner than its own
// fallback, since a holder that stopped running (SIGSTOP, a VM's steal)
// tells no one its turn is over, and told at every turn would otherwise
// keep its share of every window for as long as it slept.
//
// A process is told of its turn: whatever frees a slot (another process's
// response, a slot given back) and whatever moves a turn (the process
// ahead took its turn and left room, or left the next opening) publishes a
// push on the channel of the processes concerned, with in how long their
// turn comes; the first process of a line also wakes by itself when time
// alone opens the counter (a reset, a drip). Only the processes whose turn
// it is are told, so a push costs Redis one delivery however many
// processes share the credential. A process told of its turn while none of
// its waiters is left gives its place up, and the next one is told. A
// response that moves when a closed bucket reopens (the reset it tells,
// where a grant had estimated it) tells the first process of its line.
// Pub/sub delivers at most once: a Store's first calls wait for its
// subscription to be confirmed, a confirmation (after a reconnection too)
// has every queue whose last call went before it ask again, and every
// wait has a fallback of its own ([WithPushWait]), so a lost push costs
// time, never a wrong grant.
//
// A grant lapses ([store.Reservation.Lapsed]) when a response that came
// after it spent its bucket: a 429 paused it, or headers named a lower
// limit than the grants out assumed. The process that read a 429 takes
// its own grants of the bucket back at once; the script that applies any
// such report publishes a recall, and every process takes back its grants
// of that counter from calls that left before the recall came. The
// transport then gives the grant back and claims again, and the claim
// sees what the response taught. A recall is published only while the
// counter has grants out, so a bucket whose headers tell the truth costs
// none.
//
// When the global window is full but the bucket is not, a claim reserves
// the next openings whose moment is exact (the request that bounds each
// has answered) and near, within 50 ms: its waiters go then. A reserved
// slot counts whether or not its holder sends, so a process that stopped
// running while holding a whole next window's slots would waste them for
// every other process; openings further off are claimed when they come,
// one call per process per window.
//
// # Guarantees and approximations
//
// The semantics are those of store/memstore, proven by the same conformance
// suite (store/storetest), with these differences:
//   - FIFO is strict within a process queue; across processes and between
//     routes sharing a bucket it is approximate (lines, see above).
//   - A request's global slot and its bucket slot are taken in one atomic
//     step. A reserved slot holds its bucket slot until it opens (or gives
//     both back if its waiter gives up first). Otherwise a waiter blocked
//     by the global limit holds no bucket slot.
//   - The invalid-request guard counts for a group of processes
//     ([WithInvalidGroup]; by default every process of the prefix), as
//     Discord counts per IP address, on a key of its own. A process writes
//     its own invalid responses at most once a second and refuses at once
//     on them; it learns the group's count from the note of the process
//     whose write crossed an eighth of the budget, and reads it every
//     second while it is past half the budget.
//   - The rules of buckets are the same as the memory store's: model.lua
//     implements store/internal/model function by function, and a table of
//     transitions and a randomized differential test hold the two to the
//     same state and decisions.
//   - A granted request whose report never comes is forgotten after the
//     pending timeout ([WithPendingTimeout]), so a crashed process cannot
//     block a bucket forever.
//   - A call whose reply was lost (it timed out, the connection broke) may
//     have run, now or later: the next call of the same credential undoes
//     it if it ran, giving back what it granted, and a late copy of it does
//     nothing once a later call ran. Reports carry numbers, so one sent
//     again is applied once.
//
// # Failure policy
//
// Under [FailOpen] (the default), when a Redis call fails the Store logs it
// ([WithLogger]), counts it ([Store.Stats], [WithOnFallback]) and grants
// requests through a limiter local to the process (store/memstore) with a
// conservative share of every limit ([WithLocalShare]); waiters queued at
// the time move to it at once, so no request is dropped. A goroutine owned
// by the Store pings Redis ([WithProbeInterval]) and switches back as soon
// as it answers; each reservation is settled by the side that granted it.
// [Store.Fallbacks] counts the switches to the local limiter, for the
// transport's store fallbacks metric. Under [FailClosed], Acquire fails
// with a *[store.WaitError] wrapping [ErrUnavailable] and the cause.
//
// A call that Redis answers with an error (out of memory, a key of the
// wrong type) is not sent again at once: its reports are dropped and
// logged, the driver waits 10 ms, doubling with each such call in a row,
// and after the third the failure policy applies as for an outage.
//
// A stall is a failure. Every Redis call gets its own timeout
// ([WithCallTimeout], default 500 ms): a call that has not answered by
// then applies the policy at once, even if the client goes on waiting (a
// go-redis client without ContextTimeoutEnabled waits out its ReadTimeout
// and retries). So within about the call timeout of Redis going quiet
// (DEBUG SLEEP, CLIENT PAUSE, a failover), under FailOpen the Store limits
// locally, and under FailClosed the waiters get the error. No waiter is
// held past its context's deadline by Redis: waiting always ends with the
// context.
//
// A report ([store.Reservation.Report]) never waits for Redis, so no
// response is held by it. It joins its credential's session, bounded
// ([WithOutboxLimit] per credential; when full the oldest report is
// dropped and counted in [Stats].Dropped), and travels with the session's
// next call. Reports that could not be sent stay queued and are sent, in
// order, once Redis answers again; a claim always carries the reports
// queued before it, so what a response taught (a 429's pause, a slot given
// back, a learned bucket) is seen by the claim. Close sends what it can
// within twice the call timeout and logs how many reports it dropped.
//
// # What the local limiter and Redis owe each other
//
// Redis knows nothing of the requests the local limiters of the processes
// grant during an outage, and a local limiter knows nothing of the slots
// other processes took through Redis just before it. With at most
// [WithLocalShare] processes per credential, the Store guarantees that no
// limit is exceeded across the switch in either direction, for windows up
// to a minute long:
//
//   - Falling back, the local limiter grants nothing on a route until the
//     longest window or pause this Store saw on it (on any route, for a
//     route it never saw), and the global window plus the offset for
//     requests that count against the global limit, plus the claim's
//     offset and 250 ms, have passed since the fallback: every window that
//     grants through Redis may have opened has closed by then. Cost:
//     requests wait about 1.75 s after a fallback on routes with windows of
//     a second, and longer on routes with longer windows; requests whose
//     deadline comes first fail at once with a *[store.WaitError].
//   - Limiting locally, each process sends at most its share of a bucket
//     per window: each response spends the local bucket, which refills
//     after the longest window seen on the route. Discord's Remaining and
//     Reset-After count every process's requests, so refilling at
//     Reset-After would let a process send again on a sliding window while
//     the others' requests still count.
//   - A bucket whose headers last named fewer requests per window than the
//     local share is not limited locally: its claims wait until Redis
//     answers again, then claim through it (or fail at their deadline or
//     MaxWait, or at once with NoWait, or at once when a wait Redis told
//     of before the outage outlasts them). Shares of it would bound what
//     the processes send on average, not in each window.
//   - Returning, the Store stays for a grace period in which a request
//     needs a grant of the local limiter (at its share) as well as one of
//     Redis: one probe interval and one call timeout, so that every
//     process has returned, plus the longest window seen, so that every
//     window a local limiter opened has closed, plus 250 ms. Only then are
//     all the requests of the last window known to Redis. Cost: during the
//     grace period (about 3 s with the defaults and windows of a second)
//     each process sends at most its local share. [Stats].Grace reports it.
//
// Windows longer than a minute (hidden limits, long 429 pauses learned
// during an outage) are covered only by the local share. A process that
// never lost Redis while others did does not know of their local grants:
// the guarantee holds for outages that every process sees, as a stopped or
// stalled server is.
//
// [FUNCTION LOAD]: https://redis.io/docs/latest/commands/function-load/
package redisstore
