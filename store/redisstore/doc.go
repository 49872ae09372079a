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
// the same limits. Redis 7 or later is required ([ZADD] with LT, script
// effects replication).
//
// # Key layout
//
// All keys of one credential share one hash tag, the first 128 bits of the
// SHA-256 digest of the credential (itself a keyed hash of the token, never
// the token). So every script touches keys of one Redis Cluster slot, a
// claim is one atomic script over the bucket and the global window, and a
// cluster spreads credentials over its shards. With P the prefix and T the
// tag:
//
//	P:{T}:r        HASH   route template -> learned bucket hash ("\x00": no bucket); TTL 1 h after last use
//	P:{T}:c        HASH   gpause, unauth: deadlines of the global pause and of a 401 cooldown
//	                      (blocks are per IP, see P:{E}:e); TTL until the last + 1 s
//	P:{T}:g        ZSET   global window: permit id -> latest moment its request reached Discord
//	                      (grant + offset, lowered to the response time; a reserved grant lies
//	                      in the future); TTL delay + offset + window + 1 s
//	P:{T}:d:<M>    STRING present while a token-authenticated major answered 401/404; TTL the cooldown
//	P:{T}:s:<K>    HASH   the claims of one kind (see store.Claim.Kind), which go one at a time
//	                      for every process, K a digest of (route, major, kind): until (a hidden
//	                      sublimit's 429 holds them until then), busy (one is out: its timeout);
//	                      TTL until + retry_after, and while one is out
//	P:{T}:b:<B>    STRING a counter's state in the rate-limit model, one MessagePack array (see
//	                      model.lua); TTL until its reset, pause or pending permits' timeout + 10 min
//	P:{T}:m        HASH   digest of a major -> requests in flight on its routes whose bucket is
//	                      not known yet (discounted when a bucket is learned); TTL pending timeout
//	P:{T}:a:<S>    STRING the number of the last update of Store S applied; TTL 1 h
//	P:{T}:l:<Q>    STRING the permit id prefix of the last grant of process queue Q; TTL pending timeout
//	P:{T}:w:<B>    ZSET   process queues waiting on the counter -> arrival (tickets)
//	P:{T}:x:<B>    ZSET   the same tickets -> expiry; both TTL the longest ticket + 1 s
//	P:{G}:i        HASH   invalid responses of a group of processes per 10-second slot, G a
//	                      digest of the group ([WithInvalidGroup]); TTL 10 min 20 s
//	P:{E}:e        HASH   Cloudflare blocks of the group, E a digest of it: gate key (a route
//	                      template, or "*" for every route) -> "until|probe lease end|strikes|
//	                      probe id"; a gate lasts until a probe passes; TTL a day past the last
//	P:edge:<E>     channel notes that the blocks changed ("b", the pause and the key when a
//	                      process met a block); every process follows it from its first Acquire
//
// M is a digest of the major parameter, S the random id of a Store. B names a counter: "h" and a digest
// of (bucket hash, major) once the route's bucket is known, "r" and a
// digest of (route, major) for the probe of a route whose bucket is not
// known yet, "n" for the credential's routes without a bucket. Route
// templates and bucket hashes are stored as they are: neither contains a
// secret. Digests keep key names short and free of braces.
//
// # Whose clock
//
// The scripts read the time with Redis TIME, and every deadline stored in
// Redis is a Redis time. Processes only ever send and receive durations
// (Reset-After, Retry-After, the offset, how long to wait), which they
// measure with their own monotonic clocks. Hosts whose wall clocks disagree
// by seconds therefore still agree on every window, and no deadline depends
// on which process wrote it. Relative TTLs alone could not express a window
// that refills only once its requests were reported, nor a sliding global
// window; one clock (the server's) can. Redis 7 replicates the effects of
// scripts, not the scripts, so reading TIME is safe on replicas too.
//
// # Waiting without a herd
//
// Waiters queue in this process in a FIFO per (credential, route, major).
// Only the queue's driver calls the claim script, for the waiters at its
// front: a claim may grant several slots at once (up to [WithMaxBatch]),
// so Redis traffic does not grow with the goroutines. A refused claim
// returns how long to sleep: until the reset (or a pause) when time alone
// opens the bucket, or a short poll when only a response can (a window
// whose requests are not all reported, a probe in flight); a report
// through the same Store wakes the queues it concerns at once.
//
// Across processes, a queue refused on a known bucket takes a ticket: a
// place in a per-bucket line kept in Redis, in arrival order. Each ticket
// ahead of a claim keeps one slot of the window for its queue, and what is
// left is shared evenly with the tickets behind; a queue served in part
// goes to the back of the line. Tickets also spread the wake-ups: a queue
// far back sleeps one more window per limit of tickets ahead of it. So
// processes are served in arrival order within a window's slack, and none
// starves. Tickets expire shortly after their queue stops claiming.
//
// The global limit has a line of its own: a claim that finds the window
// full reserves the next slot that opens (see below), so that waiters of
// every process bound by the global limit are served in claim order with
// one claim each, instead of all waking when a slot opens.
//
// # One round trip
//
// One script, step.lua, applies a credential's updates in order and then
// claims for one of its queues, so a process's reports travel with its
// next claim: a request costs one round trip, not two. An update that no
// claim carries within 2 ms is written by the outbox's writer, with the
// other updates of its credential in the same script call. Refusals Redis
// reported for a credential or a webhook (a 401, a gone webhook) are
// refused in the process until their cooldown ends, without a call. The
// load benchmark prints the commands and the Redis CPU time per request
// (see the README).
//
// # Guarantees and approximations
//
// The semantics are those of store/memstore, proven by the same conformance
// suite (store/storetest), with these differences:
//   - FIFO is strict within a process queue; across processes and between
//     routes sharing a bucket it is approximate (tickets, see above).
//   - A request's global slot and its bucket slot are taken in one atomic
//     step. When the global window is full and the request that bounds it
//     has answered, the moment the next global slot opens is exact: the
//     claim reserves it, and the waiter holds its bucket slot until then
//     (or gives both back if it gives up first). Otherwise a waiter
//     blocked by the global limit holds no bucket slot.
//   - The invalid-request guard counts for a group of processes
//     ([WithInvalidGroup]; by default every process of the prefix), as
//     Discord counts per IP address, on a key of its own. A process refuses
//     at once on its own invalid responses and within about a second on
//     those of the other processes of its group (it reads the group's count
//     at most once a second while it sends requests).
//   - The rules of buckets are the same as the memory store's: model.lua
//     implements store/internal/model function by function, and a table of
//     transitions and a randomized differential test hold the two to the
//     same state and decisions.
//   - A granted request whose report never comes is forgotten after the
//     pending timeout ([WithPendingTimeout]), so a crashed process cannot
//     block a bucket forever.
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
// response is held by it. The update of a permit granted through Redis joins an outbox owned by the Store,
// bounded ([WithOutboxLimit]; when full the oldest update is dropped and
// counted in [Stats].Dropped) and written in order by a goroutine of the
// Store, several updates per call. Updates that could not be written stay
// queued and are written, in order, once Redis answers again. Each update
// carries a number, in the order of the process's updates, and Redis keeps
// the last number it applied per process: an update sent again after a
// call that timed out but ran is skipped, so no request is counted twice
// and no slot given back twice. A queue's claim carries the updates of its
// credential already queued, or waits until they are written, so that what
// a response taught (a 429's pause, a slot given back, a learned bucket)
// is seen by the next claim; queues waiting for a response are woken once
// its update is written. Close writes what it can within twice the call
// timeout and logs how many updates it dropped. A claim whose reply was
// lost (it timed out, or the connection broke) may still run in Redis
// later: the slots it may have taken are given back through the outbox, so
// they do not hold a bucket until the pending timeout.
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
// [ZADD]: https://redis.io/docs/latest/commands/zadd/
package redisstore
