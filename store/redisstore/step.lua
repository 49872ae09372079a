-- step: apply the updates of one credential's responses, in order, then
-- (optionally) claim slots for one of its queues: one round trip carries a
-- process's reports and its next claim.
--
-- KEYS (all share the credential's hash tag):
--   1 routes    HASH  route template -> learned bucket hash, or "\0" (no bucket)
--   2 cred      HASH  gpause, unauth (Redis-time deadlines, ms)
--   3 global    ZSET  global-window entries: permit id -> latest arrival (ms)
--   4 probes    HASH  major digest -> probe requests in flight
--   5 applied   STRING the sequence number of this process's last update applied
--   then, per update, 5 keys: dead, gbucket, tbucket, lastgrant, sublimit (see update below)
--   then, with a claim, 7 keys: dead, bucket, tickets, ticketexp, pbucket, lastgrant, sublimit
-- ARGV:
--   1 number of updates     2 claim (1/0)
--   then, per update, its sequence number and UPDATE_ARGS arguments; then,
--   with a claim, CLAIM_ARGS arguments; last, the clock (ms, 0: Redis TIME)
-- Reply: {n, wake_1 .. wake_n, claim reply...}: each update's wake (see
-- update), then, with a claim, the claim's reply.
--
-- An update is applied once: a process numbers its updates in order, and
-- one it sends again (after a call that timed out but ran) is skipped.

-- now, ceil, extend, loadBucket, saveBucket and the model come from
-- common.lua and model.lua, prepended when loading.

local UPDATE_ARGS, CLAIM_ARGS = 23, 18
-- A lease is lent only from a bucket with at least this many slots free
-- beyond the claim's waiters.
local LEASE_FLOOR = 64
-- How long a process's last applied update is remembered: longer than any
-- update waits to be sent again.
local APPLIED_TTL = 3600 * 1000

-- update applies what the response to one permit taught.
--
-- K:
--   1 routes   HASH  route template -> learned bucket hash, or "\0"
--   2 cred     HASH  gpause, unauth
--   3 global   ZSET  global-window entries
--   4 dead     STRING the token-authenticated major's cooldown
--   5 gbucket  STRING the model state of the bucket the permit was granted from
--   6 tbucket  STRING the bucket the response names (the same as 5 when it
--                    names none)
--   7 probes   HASH  major digest -> probe requests in flight
--   8 lastgrant STRING the permit id prefix of the last grant of the queue
--                     that claimed the permit (for A[3] = 3)
--   9 sublimit HASH  the requests of kind A[22]: until (a hidden sublimit's 429
--                    holds them until then), busy (one of them is out: its
--                    timeout); TTL until + as long again, and while one is out
-- A:
--   1 route template    2 permit id ("" when none)
--   3 sent (1/0; 2: an unused slot of a lease; 3: a slot of a claim whose reply was lost)
--   4 status            5 response bucket hash       6 has limit (1/0)
--   7 limit             8 remaining                  9 reset after (ms, < 0 unknown)
--  10 scope            11 retry (ms, offset included) 12 offset (ms)
--  13 cooldown (ms, < 0 disabled)                   14 token auth (1/0)
--  15 granted kind (0 learned, 1 probe, 2 none, -1 no permit)
--  16 granted hash     17 global (1/0)              18 bucket TTL (ms)
--  19 route TTL (ms)   20 major digest          21 anonymous: no credential (1/0)
--  22 the claim's kind (see store.Claim.Kind; "" none)
--  23 reset (X-RateLimit-Reset, ms on Discord's clock; 0 unknown)
-- Reply: {1, wake}: how many ms from now the bucket the response concerns
-- may grant again by the passing of time alone (0: now), or -1 when only a
-- response can open it or it is unknown.
local function update(K, A)
  local route, member = A[1], A[2]
  local sent = A[3] == '1'
  local status = tonumber(A[4])
  local ubucket = A[5]
  local hasLimit = A[6] == '1'
  local h = {limit = tonumber(A[7]), remaining = tonumber(A[8]), resetAfter = tonumber(A[9]),
    offset = tonumber(A[12]), reset = tonumber(A[23])}
  local scope = A[10]
  local retry = tonumber(A[11])
  local cooldown = tonumber(A[13])
  local tokenAuth = A[14] == '1'
  local gkind, ghash = tonumber(A[15]), A[16]
  local isGlobal = A[17] == '1'
  local bucketTTL, routeTTL = tonumber(A[18]), tonumber(A[19])
  local majorDigest = A[20]

  local GB, TB = K[5], K[6]

  local c = loadCred(K[2])
  local credDirty = false
  -- The request of a kind that was out after its sublimit is out no more.
  if A[22] ~= '' then redis.call('HDEL', K[9], 'busy') end

  -- wakeOf returns in how many ms b may grant by the passing of time alone:
  -- 0 for now, -1 when only a response can open it.
  local function wakeOf(b)
    if available(b, now) then return 0 end
    local w = wakeAt(b, now)
    if w > 0 then return ceil(w - now) end
    return -1
  end

  -- The bucket the permit was granted from (none without a permit).
  local gb
  if gkind >= 0 then gb = loadBucket(GB, gkind) end

  local function unprobe()
    if gkind == 1 and gb.pending > 0 then
      if redis.call('HINCRBY', K[7], majorDigest, -1) <= 0 then
        redis.call('HDEL', K[7], majorDigest)
      end
    end
  end

  if not sent then
    -- Never sent: give back the slot. A slot of a lease that nobody used
    -- is only settled: responses since it was granted may have set the
    -- bucket's count without it, so giving it back could count it twice.
    -- A slot of a claim whose reply was lost is given back only if that
    -- claim ran: it was the queue's last grant.
    if gb == nil then return {1, -1} end
    if A[3] == '3' and redis.call('GET', K[8]) ~= member:match('^(.*:)') then return {1, -1} end
    if isGlobal and member ~= '' then redis.call('ZREM', K[3], member) end
    unprobe()
    if A[3] == '2' then settle(gb) else giveBack(gb) end
    saveBucket(GB, gb, bucketTTL)
    return {1, wakeOf(gb)}
  end

  if isGlobal and member ~= '' then
    -- The request reached Discord by now: its global slot counts from no
    -- later than this.
    redis.call('ZADD', K[3], 'XX', 'LT', now, member)
  end
  if gb then
    unprobe()
    if status == 0 then unanswered(gb, now) else settle(gb) end
  end

  -- What the response teaches about the route.
  local target = gb
  local tkey = GB
  if gkind ~= 0 or ubucket == '' or ghash ~= ubucket then
    local r = redis.call('HGET', K[1], route)
    if not r then r = '' end
    local none = r == '\0'
    local hash = r
    if none then hash = '' end
    local learned = learnRoute(hash, none, ubucket, status, hasLimit)
    if learned == 1 then
      redis.call('HSET', K[1], route, ubucket)
    elseif learned == 2 then
      redis.call('HSET', K[1], route, '\0')
    end
    if learned ~= 0 and gkind == 1 then gb.retired = true end
    if ubucket ~= '' then
      if TB == GB and gb then
        target = gb
      else
        target, tkey = loadBucket(TB, 0), TB
      end
    elseif learned == 2 then
      target, tkey = nil, nil
    end
    redis.call('PEXPIRE', K[1], routeTTL)
  end

  local probes = 0
  if target and not target.known then
    probes = tonumber(redis.call('HGET', K[7], majorDigest)) or 0
  end
  local hp = nil
  if hasLimit then hp = h end
  if status == 429 then
    if credLimited(c, now, scope, retry) then
      credDirty = true
    elseif scope == 'shared' then
      if target then shared(target, now, retry) end
    elseif target and A[22] ~= '' and scope == 'user' and hasLimit and hiddenSublimit(retry, h.resetAfter, h.offset, h.remaining) then
      -- A hidden sublimit of the request's kind: only its kind waits; the
      -- bucket follows its headers.
      local untilT = math.max(tonumber(redis.call('HGET', K[9], 'until')) or 0, now + clamp(retry))
      redis.call('HSET', K[9], 'until', untilT)
      extend(K[9], math.max(1, ceil(untilT - now + clamp(retry))))
      observe(target, now, h, probes)
    elseif target then
      limited(target, now, retry, hp, probes)
    else
      c.pause, credDirty = math.max(c.pause, now + retry), true
    end
  elseif hasLimit and target then
    observe(target, now, h, probes)
  end

  -- The 401/404 cooldowns. (Invalid responses are counted per store, on a
  -- key of their own: see invalid.lua.)
  if cooldown >= 0 then
    local cd = cooldownOf(status, tokenAuth, A[21] == '1')
    if cd == 2 then
      redis.call('SET', K[4], 1, 'PX', math.max(1, ceil(cooldown)))
    elseif cd == 1 then
      c.unauthorized, credDirty = now + cooldown, true
    end
  end

  if credDirty then saveCred() end

  if gb and tkey ~= GB then saveBucket(GB, gb, bucketTTL) end
  if target then
    local wake = wakeOf(target)
    saveBucket(tkey, target, bucketTTL)
    return {1, wake}
  end
  return {1, -1}
end

-- claim answers: may up to n requests of one (credential, route, major) go now?
--
-- K:
--   1 routes    HASH  route template -> learned bucket hash, or "\0" (no bucket)
--   2 cred      HASH  gpause, unauth (Redis-time deadlines, ms)
--   3 global    ZSET  global-window entries: permit id -> latest arrival (ms)
--   4 dead      STRING present while a token-authenticated major is refused
--   5 bucket    STRING the model state of the bucket the caller resolved (learned or no-bucket)
--   6 tickets   ZSET  its waiting process queues -> arrival (ms)
--   7 ticketexp ZSET  the same queues -> expiry (ms)
--   8 pbucket   STRING the model state of the probe bucket of (route, major)
--   9 probes    HASH  major digest -> probe requests in flight
--  10 lastgrant STRING the permit id prefix of this queue's last grant
--  11 sublimit  HASH  the hidden sublimit of A[18] (see update)
-- A:
--   1 route template        2 caller's guess of the route's hash ("" unknown, "\0" none)
--   3 global (1/0)          4 global limit            5 global window (ms)
--   6 offset (ms)           7 token auth (1/0)        8 slots wanted (>= 1)
--   9 permit id prefix     10 pending timeout (ms)   11 queue id
--  12 poll interval (ms)   13 bucket TTL (ms)        14 route TTL (ms)
--  15 major digest         16 extra slots for a lease (lent only from a bucket
--                              nobody else waits on, with plenty free: a quarter at most)
--  17 spacing (ms): the claim's seeded hold (see model.lua's seed), 0 none
--  18 the claim's kind (see store.Claim.Kind; "" none)
-- The invalid-request guard is not the script's: it counts per store (an
-- IP address), on a key of its own (see invalid.lua).
-- Reply, always an array whose first element is the kind:
--   {0, granted, bucket kind (0 learned, 1 probe, 2 none), holds a ticket (1/0), delay ms}
--      a delay > 0 reserves one slot: the request may go that much later
--   {1, sleep ms, lower bound ms (0: unknown), scope (1 user, 2 global, 3 shared)[, holds a ticket]}
--   {2, retry ms, reason (2 unauthorized, 3 webhook gone)}
--   {3, hash}  the route is learned otherwise: call again with these keys
local function claim(K, A)
  local route, guess = A[1], A[2]
  local isGlobal = A[3] == '1'
  local glimit, gwindow = tonumber(A[4]), tonumber(A[5])
  local offset = tonumber(A[6])
  local tokenAuth = A[7] == '1'
  local want, prefix = tonumber(A[8]), A[9]
  local pendingTTL, qid = tonumber(A[10]), A[11]
  local poll, bucketTTL, routeTTL = tonumber(A[12]), tonumber(A[13]), tonumber(A[14])
  local majorDigest = A[15]
  local extra = tonumber(A[16]) or 0
  local spacing = tonumber(A[17]) or 0

  local c = loadCred(K[2])
  local gpause = c.pause

  local refused = refusal(c, tokenAuth, K[4])
  if refused then return refused end

  -- The claims of a kind go one at a time, whatever process makes them:
  -- the kind has a hidden sublimit, and the next one leaves only once the
  -- response of the one before says whether it met it. A sublimit's 429
  -- holds them (only them) until it ends. While they wait, their queue
  -- leaves the bucket's line.
  local subTurn = false
  if A[18] ~= '' then
    local st = redis.call('HMGET', K[11], 'until', 'busy')
    local untilT, busy = tonumber(st[1]) or 0, tonumber(st[2]) or 0
    local w, lower = 0, 0
    if untilT > now then
      w = ceil(untilT - now)
      lower = w
    elseif busy > now then
      w = poll -- until the response of the one that is out
    else
      subTurn = true
      want, extra = 1, 0
    end
    if not subTurn then
      redis.call('ZREM', K[6], qid)
      redis.call('ZREM', K[7], qid)
      return {1, w, lower, 1, 0}
    end
  end

  -- Resolve the route. The caller named the keys of the bucket it expects;
  -- when the route maps elsewhere it must call again with the right keys.
  local r = routeHash(K[1], route)
  if r ~= guess then return {3, r} end
  if r ~= '' then redis.call('PEXPIRE', K[1], routeTTL) end

  -- The global window first: a claim it refuses need not read the bucket.
  local cnt, gfree, reserve = 0, 0, nil
  if isGlobal then
    if gpause > now then
      local w = ceil(gpause - now)
      return {1, w, w, 2}
    end
    redis.call('ZREMRANGEBYSCORE', K[3], '-inf', now - gwindow)
    cnt = redis.call('ZCARD', K[3])
    gfree = glimit - cnt
    if gfree <= 0 then
      -- The window is full. A grant at moment T is allowed when fewer than
      -- glimit entries lie after T - gwindow, so the first slot opens
      -- gwindow after the entry glimit places from the end.
      local e = redis.call('ZRANGE', K[3], cnt - glimit, cnt - glimit, 'WITHSCORES')
      local score = tonumber(e[2]) or now
      if score > now then
        -- That entry's request has not answered yet: its slot opens
        -- gwindow after its answer, at the latest gwindow after its
        -- score, at the earliest gwindow after its grant (its score less
        -- the offset). Wait and ask again.
        local lower = ceil(score - offset + gwindow - now)
        return {1, math.min(math.max(lower, poll), ceil(score + gwindow - now)), lower, 2}
      end
      -- Its request has answered, so the moment is exact: reserve that
      -- slot. Grants decided later count this entry and cannot take it, so
      -- the waiters of every process are served in the order they
      -- claimed, each with a single claim.
      reserve = ceil(score + gwindow - now)
    end
  end

  local B = K[5]
  local kind = 0
  local b, found
  if r == '' then
    kind, B = 1, K[8]
  elseif r == '\0' then
    kind = 2
  end
  b, found = loadBucket(B, kind)
  if kind == 0 and not found then
    -- The route was learned on another major while this major's probe
    -- is still in flight: wait for that probe's answer.
    local pb = loadBucket(K[8], 1)
    if pb.pending > 0 then kind, B, b = 1, K[8], pb end
  end
  seed(b, spacing)

  if not available(b, now) and now < b.pause then
    local w = ceil(b.pause - now)
    return {1, w, w, 3}
  end

  -- Tickets: process queues that were refused on a learned bucket, in
  -- arrival order. Each one ahead keeps a slot; what is left is shared with
  -- those behind.
  local useTickets = kind == 0
  local ahead, behind, rank, line = 0, 1, false, 0
  if useTickets then
    -- The line holds the same queues as their expiries: an empty line has
    -- nothing to expire.
    local m = redis.call('ZCARD', K[6])
    line = m
    if m > 0 then
      local gone = redis.call('ZRANGEBYSCORE', K[7], '-inf', now)
      if #gone > 0 then
        for i = 1, #gone, 1000 do
          local j = math.min(i + 999, #gone)
          redis.call('ZREM', K[7], unpack(gone, i, j))
          redis.call('ZREM', K[6], unpack(gone, i, j))
        end
        m = redis.call('ZCARD', K[6])
      end
      rank = m > 0 and redis.call('ZRANK', K[6], qid)
    end
    if rank then
      ahead, behind = rank, m - rank
    else
      ahead, behind = m, 1
    end
  end

  -- How many of the model's successive grants at now are this queue's: the
  -- first ones are kept for the queues ahead.
  local free = 0
  if kind == 2 then
    free = want
  else
    local probe = {}
    for k, v in pairs(b) do probe[k] = v end
    while free < want + 4 * extra + ahead and available(probe, now) do
      take(probe, now)
      free = free + 1
    end
  end
  local avail = free - ahead
  if avail <= 0 then
    local sleep, lower = poll, 0
    local wk = wakeAt(b, now)
    if wk > 0 and (free == 0 or b.remaining <= 0) then
      lower = ceil(bound(b, now, ahead) - now)
      sleep = math.max(ceil(wk - now), lower)
      if b.sliding then
        -- One slot drips at a time: the queues ahead take the first ones.
        sleep = sleep + ceil(ahead * tau(b) / 1000)
      end
    end
    if useTickets then
      if not rank then redis.call('ZADD', K[6], now, qid) end
      local exp = now + sleep + poll + 1000
      redis.call('ZADD', K[7], exp, qid)
      local keep = ceil(exp - now) + 1000
      extend(K[6], keep)
      extend(K[7], keep)
      return {1, sleep, lower, 1, 1}
    end
    return {1, sleep, lower, 1, 0}
  end
  avail = math.ceil(avail / behind)

  -- zaddEach adds members prefix .. 1 to prefix .. n to the sorted set key,
  -- all with score.
  local function zaddEach(key, score, n)
    local args = {}
    for i = 1, n do
      args[2 * i - 1] = score
      args[2 * i] = prefix .. i
    end
    for i = 1, #args, 1000 do
      redis.call('ZADD', key, unpack(args, i, math.min(i + 999, #args)))
    end
  end

  local k = math.min(want, avail)
  local plenty = kind == 2 or (b.known and b.remaining - want >= LEASE_FLOOR)
  local lease = extra > 0 and kind ~= 1 and line == 0 and k == want and plenty
  if lease then
    -- Nobody else waits on a bucket with plenty left: lend a few slots,
    -- no more than it has free now.
    k = math.min(avail, k + extra)
  end
  local delay = 0

  if isGlobal then
    if reserve then
      delay, k = reserve, 1
    elseif k > gfree then
      k = gfree
    end
    if lease and k > want then
      k = math.max(math.min(want, gfree), math.min(k, want + math.floor((gfree - want) / 4)))
    end
    zaddEach(K[3], now + delay + offset, k)
    -- Every key gets a TTL when created: one that held entries has one.
    if cnt > 0 then
      redis.call('PEXPIRE', K[3], ceil(delay + offset + gwindow) + 1000, 'GT')
    else
      redis.call('PEXPIRE', K[3], ceil(delay + offset + gwindow) + 1000)
    end
  end

  -- The queue's last grant, so that giving back the slots of a claim whose
  -- reply was lost changes nothing unless the claim ran.
  redis.call('SET', K[10], prefix, 'PX', pendingTTL)
  if subTurn then
    redis.call('HSET', K[11], 'busy', now + delay + pendingTTL)
    extend(K[11], ceil(delay + pendingTTL) + 1000)
  end
  if kind ~= 2 then
    for _ = 1, k do take(b, now) end
    b.pendingUntil = now + delay + pendingTTL
    saveBucket(B, b, bucketTTL)
    if kind == 1 then
      redis.call('HINCRBY', K[9], majorDigest, k)
      extend(K[9], delay + pendingTTL + 1000)
    end
  end

  local ticket = 0
  if useTickets then
    if want > k then
      ticket = 1
      -- Served in part: go to the back of the line.
      redis.call('ZADD', K[6], now, qid)
      redis.call('ZADD', K[7], now + poll + 1000, qid)
      extend(K[6], poll + 2000)
      extend(K[7], poll + 2000)
    elseif rank then
      redis.call('ZREM', K[6], qid)
      redis.call('ZREM', K[7], qid)
    end
  end

  local known = 0
  if b.known then known = b.limit end
  return {0, k, kind, ticket, delay, known}
end

local nu, withClaim = tonumber(ARGV[1]), ARGV[2] == '1'
local reply = {nu}
local k, a = 6, 3
local last = tonumber(redis.call('GET', KEYS[5])) or -1
local applied = last
for i = 1, nu do
  local seq = tonumber(ARGV[a])
  local K = {KEYS[1], KEYS[2], KEYS[3], KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[4], KEYS[k + 3], KEYS[k + 4]}
  local A = {}
  for j = 1, UPDATE_ARGS do A[j] = ARGV[a + j] end
  if seq > last then
    local r = update(K, A)
    reply[i + 1] = r[2]
    applied = math.max(applied, seq)
  else
    reply[i + 1] = -1
  end
  k, a = k + 5, a + 1 + UPDATE_ARGS
end
if applied > last then
  redis.call('SET', KEYS[5], applied, 'PX', APPLIED_TTL)
end
if withClaim then
  local K = {KEYS[1], KEYS[2], KEYS[3], KEYS[k], KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], KEYS[k + 4], KEYS[4], KEYS[k + 5],
    KEYS[k + 6]}
  local A = {}
  for j = 1, CLAIM_ARGS do A[j] = ARGV[a + j - 1] end
  local r = claim(K, A)
  for _, x in ipairs(r) do reply[#reply + 1] = x end
end
flush()
return reply
