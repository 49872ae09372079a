-- step: one round trip of one process for one credential. It applies the
-- process's reports (what its requests' responses taught), in order, then
-- answers its claims (may these requests go now?), in order. Everything a
-- process has to tell Redis about a credential, and ask it, travels in one
-- call.
--
-- KEYS (all share the credential's hash tag):
--   1 routes  HASH   route template -> learned bucket hash, or "\0" (no bucket)
--   2 cred    HASH   gpause, unauth (deadlines), gexp, rexp (TTL horizons),
--                    glu (until when processes may wait in the global line), ms
--   3 global  ZSET   the global window: permit id -> latest arrival at Discord
--                    (ms): the response's arrival once answered, the grant
--                    plus the hold and UNANSWERED (half a ms) before
--   4 probes  HASH   major digest -> probe requests in flight; major digest
--                    and "@" -> when the last of them is overdue (ms)
--   5 proc    STRING this process's record for the credential: the number of its
--                    last call applied, of its last report applied, and what each
--                    claim of that call was granted
--   6 gline   ZSET   the global window's line (see common.lua)
--   7 gtix    HASH   its tickets
--   then UNDO_KEYS per claim of an undone call, REPORT_KEYS per report,
--   CLAIM_KEYS per claim, LEAVE_KEYS per line left
-- ARGV:
--   1 call number: a process numbers its calls for a credential; a call
--     whose number is not above the last applied is a late copy and does
--     nothing
--   2 how many calls whose replies were lost this call undoes (see below)
--   3 how many lines this process leaves (see below)
--   4 this process's id   5 the prefix of the processes' channels
--   6 reports   7 claims
--   8 global limit   9 global window (ms)   10 hold (ms): how long after its
--     grant a request reaches Discord at the latest
--   11 pending timeout (ms)  12 bucket TTL (ms)  13 route TTL (ms)
--   14 ticket grace (ms): how long past its expected turn a ticket holds
--   15 push wait (ms): how long a claim that only a push can end waits
--      before asking again
--   16 the credential's tag, naming it in pushes
--   then the undone calls, REPORT_ARGS per report, CLAIM_ARGS per claim,
--   LEAVE_ARGS per line left; last the clock (ms, 0: Redis TIME)
-- Reply: {1, n, wake_1 .. wake_n, m, claim_1 .. claim_m}, each claim reply
-- preceded by its length; {-1} for a late copy of a call.
--
-- The Lua of Redis is slow at creating tables and closures: the code reads
-- KEYS and ARGV in place and defines its helpers once (the library is
-- loaded once, see scripts.go).

local CALL_ARGS = 16
local UNDO_KEYS, UNDO_ARGS = 2, 3
local REPORT_KEYS, REPORT_ARGS = 8, 25
local CLAIM_KEYS, CLAIM_ARGS = 8, 16
local LEAVE_KEYS, LEAVE_ARGS = 3, 1
-- A lease is lent only from a bucket with at least this many slots free
-- beyond the claim's waiters.
local LEASE_FLOOR = 64
-- How long a process's record is kept: longer than any call is sent again.
local PROC_TTL = 3600 * 1000
-- Pushes per line per call, at most.
local MAX_PUSH = 4

-- RESERVE_AHEAD bounds how far ahead (ms) a claim reserves slots of a full
-- global window. A reserved slot counts in the window whether or not its
-- holder sends: a process that stops running (SIGSTOP, a VM's steal, a
-- long pause) while it holds slots for the next window wastes them for
-- every other process. A slot further off is claimed when it opens: one
-- call per process per window, however many it sends then. 200 ms, not
-- less: with a nearer bound, processes whose bucket had room but whose
-- global window was full came back for each slot, most of them refused
-- (a sliding bucket at 64 processes: about 10 commands per request
-- against 5).
local RESERVE_AHEAD = 200

-- What one call says of itself (see ARGV above), set by stepMain, and
-- the number of the last report it applied.
local callNo, undoCalls, nLeaves, me, chan, nReports, nClaims, lastReport
local glimit, gwindow, hold, pendingTTL, bucketTTL, routeTTL, grace, pushWait, tag
-- This process's record, as the call found it.
local proc

-- The global window, read once per call when a claim needs it: the
-- entries that still count (cnt, kept up to date as the call grants) and
-- its line. served is what the call granted in it; tix, per ticket of this
-- process the call's claims used (its id, and its id and "!" for the
-- urgent lane), {want: what they still wait for, served, at: when the
-- first of them expects its turn}.
local G
local function globalLoad(c)
  if not G then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - gwindow)
    G = {cnt = redis.call('ZCARD', KEYS[3]), served = 0, tix = {}}
    if c.glu > now then G.line = lineLoad(KEYS[6], KEYS[7], me) else G.line = lineEmpty(KEYS[6], KEYS[7]) end
  end
  return G
end

-- globalSlot returns when the n-th grant from now can go by the global
-- window (see common.lua's slotOf).
local function globalSlot(n)
  return slotOf(KEYS[3], G.cnt, glimit, gwindow, hold, n)
end

-- pushGlobalHead tells the first holder of the global line other than
-- this process that its turn may have come, when it has: its first slot is
-- free or exact.
local function pushGlobalHead()
  local head = firstOther(G.line, me)
  if not head then return end
  local at, exact = globalSlot(1)
  if exact then push(chan, tag, owner(head), 'g', at - now) end
end

-- tellHeads tells the first n holders of line (other than this process,
-- and before position upto if given) that their turn may have come, with
-- the route's hash if given; each has the ticket grace to claim (see
-- pushHeads).
local function tellHeads(line, name, n, upto, hash)
  pushHeads(chan, tag, line, name, n, me, upto, hash, now + grace)
end

-- Buckets whose line this call may have to tell, by key: {lk, lt (the
-- line's keys), name, opened (a report may have opened the bucket),
-- retired (a probe's route was learned; hash, the bucket it maps to),
-- before (when the closed bucket was to reopen before the call's reports:
-- see reopen)}.
local watched, watchOrder
local function watch(key, lk, lt, name)
  local w = watched[key]
  if not w then
    w = {lk = lk, lt = lt, name = name}
    watched[key] = w
    watchOrder[#watchOrder + 1] = key
  end
  return w
end

-- reopen returns when b, closed, reopens by the passing of time alone as
-- far as this call knows, a moment it may only have estimated (the reset
-- of a window whose first request is still out); 0 when b is open.
local function reopen(b)
  if available(b, now) then return 0 end
  return math.max(bound(b, now, 0), wakeAt(b, now))
end

-- wakeOf returns in how many ms b may grant by the passing of time alone:
-- 0 for now, -1 when only a response can open it.
local function wakeOf(b)
  if available(b, now) then return 0 end
  local w = wakeAt(b, now)
  if w > 0 then return ceil(w - now) end
  return -1
end

-- unprobe counts n probe requests of the major less in flight (1 when n
-- is nil).
local function unprobe(majorDigest, n)
  if redis.call('HINCRBY', KEYS[4], majorDigest, -(n or 1)) <= 0 then
    redis.call('HDEL', KEYS[4], majorDigest, majorDigest .. '@')
  end
end

-- KEPT_POLL bounds (ms) how long a claim that only the slots kept for
-- probes hold waits before it asks again: a probe's answer comes within a
-- round trip, and tells no one.
local KEPT_POLL = 20

-- kept returns how many slots the known bucket b keeps for the probes in
-- flight on routes of its major (digest md) whose bucket is not known yet,
-- and until when: such a route may turn out to share b, and Discord then
-- counts its request in b's window. A probe keeps its slot until its
-- answer, or until it is overdue. (memstore's bucket.kept.) It reads
-- nothing while no probe of the credential c may be in flight.
local function kept(c, b, md)
  if c.pru <= now or not b.known or b.unlimited then return 0, 0 end
  local f = redis.call('HMGET', KEYS[4], md, md .. '@')
  local n, untilT = tonumber(f[1]) or 0, tonumber(f[2]) or 0
  if n <= 0 or untilT <= now then return 0, 0 end
  return n, untilT
end

-- Recalls. A response that spent a bucket while grants of it were out (a
-- 429 paused it, or a limit lowered from limit left its fixed window fewer
-- slots than it granted; a count that only looks short because requests
-- are still in flight recalls nothing) is published on chan .. '!' as
-- "<tag> <line>" ("*" for a global 429, which spends every grant that
-- counts against the global limit): every process takes back the grants
-- of that line it has not sent yet, and claims again, so none meets the
-- 429 another request met.
local function recall(name)
  local k = '!' .. name
  if pushed[k] then return end
  pushed[k] = true
  redis.call('PUBLISH', chan .. '!', tag .. ' ' .. name)
end

local function spent(b, limit)
  return b.pending > 0 and (now < b.pause or b.limit < limit and not b.sliding and b.remaining < 0 and now < b.resetAt)
end

-- update applies what the response to one permit taught. Its keys start
-- at KEYS[k], its arguments at ARGV[a].
--
-- Keys: k dead (the token-authenticated major's cooldown), k+1 gbucket
--   (the bucket the permit was granted from), k+2 tbucket (the bucket the
--   response names; the same as k+1 when it names none), k+3 sublimit (the
--   requests of the claim's kind: until, busy, and the processes waiting
--   as fields "w" .. id), k+4, k+5 gbucket's line, k+6, k+7 tbucket's line
-- Arguments, from a:
--   +0 route template    +1 permit id ("" when none)
--   +2 sent (1/0; 2: an unused slot of a lease)
--   +3 status            +4 response bucket hash       +5 has limit (1/0)
--   +6 limit             +7 remaining                  +8 reset after (ms, < 0 unknown)
--   +9 scope            +10 retry (ms, offset included) +11 offset (ms)
--  +12 cooldown (ms, < 0 disabled)                    +13 token auth (1/0)
--  +14 granted kind (0 learned, 1 probe, 2 none, -1 no permit)
--  +15 granted hash     +16 global (1/0)              +17 major digest
--  +18 anonymous: no credential (1/0)                 +19 the claim's kind ("" none)
--  +20 reset (X-RateLimit-Reset, ms on Discord's clock; 0 unknown)
--  +21 age (ms): how long before this call the response arrived
--  +22 the granted bucket's name, +23 the response bucket's name, +24 the
--      kind's name (for pushes)
-- Reply: how many ms from now the bucket the response concerns may grant
-- again by the passing of time alone (0: now), or -1 when only a response
-- can open it or it is unknown.
local function update(k, a)
  local member = ARGV[a + 1]
  local sentArg = ARGV[a + 2]
  local status = tonumber(ARGV[a + 3])
  local ubucket = ARGV[a + 4]
  local hasLimit = ARGV[a + 5] == '1'
  local scope, retry = ARGV[a + 9], tonumber(ARGV[a + 10])
  local gkind = tonumber(ARGV[a + 14])
  local isGlobal = ARGV[a + 16] == '1'
  local majorDigest = ARGV[a + 17]
  local kindName = ARGV[a + 19]
  -- The response arrived age ms ago: what it says dates from then.
  local t = now - math.min(math.max(tonumber(ARGV[a + 21]) or 0, 0), 60000)
  local GB, TB = KEYS[k + 1], KEYS[k + 2]
  local c = loadCred(KEYS[2])

  -- The request of a kind that was out is out no more: tell the processes
  -- waiting for their turn.
  if kindName ~= '' then
    local f = redis.call('HGETALL', KEYS[k + 3])
    local gone = {'busy'}
    for i = 1, #f, 2 do
      local id = string.match(f[i], '^w(.+)$')
      if id then
        if (tonumber(f[i + 1]) or 0) > now and id ~= me then push(chan, tag, id, 's' .. ARGV[a + 24], 0) end
        gone[#gone + 1] = f[i]
      end
    end
    redis.call('HDEL', KEYS[k + 3], unpack(gone))
  end

  -- The bucket the permit was granted from (none without a permit).
  local gb, gw
  if gkind >= 0 then
    gb = loadBucket(GB, gkind)
    if gkind ~= 2 and gb.lineUntil > now then
      gw = watch(GB, KEYS[k + 4], KEYS[k + 5], ARGV[a + 22])
      if available(gb, now) then gw.wasOpen = true end
      if gw.before == nil then gw.before = reopen(gb) end
    end
  end

  if sentArg ~= '1' then
    -- Never sent: give back the slot. A slot of a lease that nobody used
    -- is only settled: responses since it was granted may have set the
    -- bucket's count without it, so giving it back could count it twice.
    if gb == nil then return -1 end
    if isGlobal and member ~= '' then
      local gone = redis.call('ZREM', KEYS[3], member)
      if G then G.cnt = G.cnt - gone end
      if c.glu > now then
        globalLoad(c)
        G.lowered = true
      end
    end
    if gkind == 1 and gb.pending > 0 then unprobe(majorDigest) end
    if sentArg == '2' then settle(gb) else giveBack(gb, now) end
    saveBucket(GB, gb, bucketTTL)
    if gw and not gw.wasOpen then gw.opened = true end
    return wakeOf(gb)
  end

  if isGlobal and member ~= '' then
    -- The request reached Discord, if at all, by the time its response (or
    -- its failure) arrived: its global slot counts from then. That is
    -- later than the hold when the request left late (its process was
    -- descheduled after the check of its grant's age, or its connection
    -- took long to open): counted from then, its window still closes
    -- before later requests reach Discord, as long as the response came
    -- within a window of the grant.
    redis.call('ZADD', KEYS[3], 'XX', t, member)
    if c.glu > now then
      globalLoad(c)
      G.lowered = true
    end
  end
  if gb then
    if gkind == 1 and gb.pending > 0 then unprobe(majorDigest) end
    if status == 0 then
      unanswered(gb, t)
    elseif uncounted(status, scope, hasLimit) then
      giveBack(gb, now)
    else
      settle(gb)
    end
  end

  -- What the response teaches about the route.
  local target, tkey = gb, GB
  if gkind ~= 0 or ubucket == '' or ARGV[a + 15] ~= ubucket then
    local route = ARGV[a]
    local r = redis.call('HGET', KEYS[1], route)
    if not r then r = '' end
    local none = r == '\0'
    local hash = r
    if none then hash = '' end
    local learned = learnRoute(hash, none, ubucket, status, hasLimit)
    if learned == 1 then
      redis.call('HSET', KEYS[1], route, ubucket)
    elseif learned == 2 then
      redis.call('HSET', KEYS[1], route, '\0')
    end
    if learned ~= 0 then
      extend(KEYS[1], routeTTL)
      if gkind == 1 then
        -- The probe's route is learned: whoever waited for it asks again.
        gb.retired = true
        if gw then
          gw.retired = true
          if learned == 1 then gw.hash = ubucket end
        end
      end
    end
    if ubucket ~= '' then
      if TB ~= GB or not gb then
        target, tkey = loadBucket(TB, 0), TB
      end
    elseif learned == 2 then
      target, tkey = nil, nil
    end
  end
  local tw
  if target and tkey ~= GB and target.lineUntil > now then
    tw = watch(TB, KEYS[k + 6], KEYS[k + 7], ARGV[a + 23])
    if available(target, now) then tw.wasOpen = true end
    if tw.before == nil then tw.before = reopen(target) end
  end

  -- The limits before the response, for telling a lowered one (spent).
  local tlimit, glimit0 = target and target.limit or 0, gb and gb.limit or 0
  local probes = 0
  if target and not target.known then
    probes = tonumber(redis.call('HGET', KEYS[4], majorDigest)) or 0
  end
  local h = nil
  if hasLimit then
    h = {limit = tonumber(ARGV[a + 6]), remaining = tonumber(ARGV[a + 7]), resetAfter = tonumber(ARGV[a + 8]),
      offset = tonumber(ARGV[a + 11]), reset = tonumber(ARGV[a + 20])}
  end
  if status == 429 then
    if credLimited(c, t, scope, retry) then
      saveCred()
    elseif scope == 'shared' then
      -- No wait: the process holds the resource alone (edge.Gates).
      if target and retry > 0 then shared(target, t, retry) end
      if target and h then observe(target, t, h, probes) end
    elseif target and kindName ~= '' and scope == 'user' and h and hiddenSublimit(retry, h.resetAfter, h.offset, h.remaining) then
      -- A hidden sublimit of the request's kind: only its kind waits; the
      -- bucket follows its headers.
      local untilT = math.max(tonumber(redis.call('HGET', KEYS[k + 3], 'until')) or 0, t + clamp(retry))
      redis.call('HSET', KEYS[k + 3], 'until', untilT)
      extend(KEYS[k + 3], math.max(1, ceil(untilT - now + clamp(retry))))
      observe(target, t, h, probes)
    elseif target then
      limited(target, t, retry, h, probes)
    else
      c.pause = math.max(c.pause, t + retry)
      saveCred()
    end
  elseif h and target then
    observe(target, t, h, probes)
  end
  if status == 429 and scope == 'global' then recall('*') end
  if target and spent(target, tlimit) then recall(ARGV[a + (tkey == GB and 22 or 23)]) end
  if gb and tkey ~= GB and spent(gb, glimit0) then recall(ARGV[a + 22]) end

  -- The 401/404 cooldowns. (Invalid responses are counted per group of
  -- processes, on a key of their own: see invalid.lua.)
  local cooldown = tonumber(ARGV[a + 12])
  if cooldown >= 0 then
    local cd = cooldownOf(status, ARGV[a + 13] == '1', ARGV[a + 18] == '1')
    if cd == 2 then
      redis.call('SET', KEYS[k], 1, 'PX', math.max(1, ceil(cooldown)))
    elseif cd == 1 then
      c.unauthorized = t + cooldown
      saveCred()
    end
  end

  if gb then
    saveBucket(GB, gb, bucketTTL)
    -- A response that opened the bucket: the processes in its line may go.
    if gw and not gw.wasOpen then gw.opened = true end
  end
  if target then
    saveBucket(tkey, target, bucketTTL)
    if tw and not tw.wasOpen then tw.opened = true end
    return wakeOf(target)
  end
  return -1
end

-- Claim replies: {0, granted, bucket kind (0 learned, 1 probe, 2 none),
-- the bucket's limit (0 unknown), next, reserved, delay_1 ..
-- delay_reserved}: the last `reserved` slots open that many ms from now
-- (the global window is full until then), and the claim's other waiters,
-- if any, may claim again in next ms (0: at once); {1, at, bound, scope (1 user, 2 global, 3 a pause),
-- push (1/0), line}: ask again in at ms at the latest, the wait lasts bound
-- ms at least (0: unknown), and with push set a push on line (the bucket's
-- name) may come first; {2, retry ms, reason (2 unauthorized, 3 webhook
-- gone)}; {3, hash}: the route maps to another bucket, ask again with its
-- keys.
local replyOf

-- Tickets this call gives or takes, per bucket line and ticket.
local intents, intentOrder
local function intent(line, holder, name, b, bkey)
  local key = line.L .. '\0' .. holder
  local it = intents[key]
  if not it then
    it = {line = line, holder = holder, name = name, b = b, bkey = bkey, want = 0, served = 0, at = 0, life = -1}
    intents[key] = it
    intentOrder[#intentOrder + 1] = key
  end
  return it
end

-- gticket returns what this call says of the global line's ticket holder.
local function gticket(holder)
  local t = G.tix[holder]
  if not t then
    t = {want = 0, served = 0, at = 0, life = -1}
    G.tix[holder] = t
  end
  return t
end

-- outlive has ticket t (an intent, or a global ticket) held for a claim
-- whose waiters wait life ms at most (0: without a bound): as long as the
-- longest-lived claim it holds for needs it.
local function outlive(t, life)
  if life == 0 or t.life == 0 then t.life = 0 elseif life > t.life then t.life = life end
end

-- worth reports whether a ticket whose turn comes in wait ms at the
-- earliest is worth taking for waiters that wait life ms at most (0:
-- without a bound). A waiter gone before its turn would leave the others
-- waiting for it, and be told its turn for nothing: a fail-fast caller
-- takes no place in line.
local function worth(life, wait)
  return life == 0 or life > wait
end

-- share returns how many slots of a counter of limit slots per window a
-- ticket of line takes in one turn while others wait in it: an even share
-- of the window with id counted among them, but at least TURN_MIN (or
-- what it wants, if less), so that a turn is worth its round trips.
local TURN_MIN = 4
local function share(line, id, limit, want)
  local n = line.n
  if not (line.pos[id] or line.rank[id]) then n = n + 1 end
  if n <= 1 or limit <= 0 then return limit end
  return math.min(limit, math.max(math.ceil(limit / n), math.min(want, TURN_MIN)))
end

-- claim answers claim i: may up to want requests of one (route, major,
-- kind) go now? Claims are answered in order: a claim sees what the ones
-- before it took. Its keys start at KEYS[k], its arguments at ARGV[a].
--
-- Keys: k dead, k+1 bucket (the bucket of the caller's guess), k+2, k+3
--   its line, k+4 pbucket (the probe counter of the route and major),
--   k+5, k+6 its line, k+7 sublimit (see update)
-- Arguments, from a:
--   +0 route template    +1 the caller's guess of the route's hash ("" unknown, "\0" none)
--   +2 global (1/0)      +3 token auth (1/0)      +4 slots wanted (>= 1)
--   +5 extra slots for a lease (lent only from a bucket nobody else waits on,
--      with plenty free: a quarter at most)
--   +6 permit id prefix  +7 major digest         +8 spacing (ms): the seeded hold, 0 none
--   +9 the claim's kind ("" none)               +10 urgent (1/0)
--  +11 the guessed bucket's name  +12 the probe counter's name  +13 the kind's name
--  +14 life (ms): how long the claim's waiters wait at most (0: without a bound)
--  +15 sole: the places in lines only this claim's queue needs in its
--      process: 1 the global window's, 2 the bucket's, 3 both
local function claim(i, k, a)
  local guess = ARGV[a + 1]
  local isGlobal = ARGV[a + 2] == '1'
  local want, extra = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local sub = ARGV[a + 9]
  local urgent = ARGV[a + 10] == '1'
  local life = tonumber(ARGV[a + 14]) or 0
  local sole = tonumber(ARGV[a + 15]) or 0
  local soleG, soleB = sole % 2 == 1, sole >= 2

  local c = loadCred(KEYS[2])
  local refused = refusal(c, ARGV[a + 3] == '1', KEYS[k])
  if refused then return refused end

  -- The claims of a kind go one at a time, whatever process makes them:
  -- the kind has a hidden sublimit, and the next one leaves only once the
  -- response of the one before says whether it met it. A sublimit's 429
  -- holds them (only them) until it ends.
  local subTurn = false
  if sub ~= '' then
    local st = redis.call('HMGET', KEYS[k + 7], 'until', 'busy')
    local untilT, busy = tonumber(st[1]) or 0, tonumber(st[2]) or 0
    if untilT > now then
      local w = ceil(untilT - now)
      return {1, w, w, 1, 0, ''}
    elseif busy > now then
      -- One is out: its report tells the processes waiting here.
      local w = math.min(ceil(busy - now), pushWait)
      redis.call('HSET', KEYS[k + 7], 'w' .. me, now + w + grace)
      return {1, w, 0, 1, 1, 's' .. ARGV[a + 13]}
    end
    subTurn, want, extra = true, 1, 0
  end

  -- Resolve the route. The caller named the keys of the bucket it expects;
  -- when the route maps elsewhere it must ask again with the right keys.
  local r = routeHash(KEYS[1], ARGV[a])
  if r ~= guess then return {3, r} end
  if r ~= '' then touchRoutes(KEYS[1], c, routeTTL) end

  local B, LK, LT, kind, name = KEYS[k + 1], KEYS[k + 2], KEYS[k + 3], 0, ARGV[a + 11]
  if r == '' then
    B, LK, LT, kind, name = KEYS[k + 4], KEYS[k + 5], KEYS[k + 6], 1, ARGV[a + 12]
  elseif r == '\0' then
    kind = 2
  end
  local b, found = loadBucket(B, kind)
  if kind == 0 and not found then
    -- The route was learned on another major while this major's probe
    -- is still in flight: wait for that probe's answer.
    local pb = loadBucket(KEYS[k + 4], 1)
    if pb.pending > 0 then B, LK, LT, kind, name, b = KEYS[k + 4], KEYS[k + 5], KEYS[k + 6], 1, ARGV[a + 12], pb end
  end
  seed(b, tonumber(ARGV[a + 8]))

  if not available(b, now) and now < b.pause then
    local w = ceil(b.pause - now)
    return {1, w, w, 3, 0, ''}
  end
  if isGlobal then
    if c.pause > now then
      local w = ceil(c.pause - now)
      return {1, w, w, 2, 0, ''}
    end
    globalLoad(c)
  end
  -- The ticket this claim's waiters hold in lines: the process's own, or
  -- its urgent one.
  local holder = me
  if urgent then holder = me .. '!' end

  -- What the line ahead keeps: each holder ahead of this process keeps
  -- the slots it waits for, of the bucket and of the global window.
  local line, aheadB, posB, expiresB = nil, 0, nil, nil
  local freeB = want + extra
  local keptB, keptUntil = 0, 0
  if kind ~= 2 then
    if b.lineUntil > now then
      line = lineLoad(LK, LT, me)
      aheadB, posB, expiresB = lineAhead(line, holder, urgent)
    else
      line = lineEmpty(LK, LT)
    end
    if kind == 0 then keptB, keptUntil = kept(c, b, ARGV[a + 7]) end
    freeB = room(b, now, want + extra + aheadB + keptB) - aheadB - keptB
  end
  local aheadG, freeG = 0, want + extra
  if isGlobal then
    aheadG = lineAhead(G.line, holder, urgent)
    freeG = glimit - G.cnt - aheadG
  end

  -- While others wait, a turn takes an even share of the counter: the
  -- waiting processes are served side by side, each at most a share per
  -- window, rather than one after the other.
  local turnB, turnG = want, want
  if line and b.known and b.limit > 0 then
    turnB = b.limit -- a turn takes at most a window's worth
    if lineOthers(line, me) then turnB = share(line, holder, b.limit, want) end
  end
  if isGlobal and lineOthers(G.line, me) then turnG = share(G.line, holder, glimit, want) end
  local turn = math.min(want, turnB, turnG)

  local n = math.max(0, math.min(turn, freeB, freeG))
  if extra > 0 and kind ~= 1 and n == want and not (line and lineOthers(line, me))
    and not (isGlobal and lineOthers(G.line, me)) and (kind == 2 or (b.known and b.remaining - want >= LEASE_FLOOR)) then
    -- Nobody else waits and plenty is left: lend a few slots, no more than
    -- the bucket has free now, nor than a quarter of the global window's.
    local nl = math.min(want + extra, freeB)
    if isGlobal then nl = math.min(nl, math.max(want, want + math.floor((freeG - want) / 4))) end
    n = math.max(n, nl)
  end

  -- The global window is full but the bucket is not: reserve the next
  -- slots whose opening is exact and near (RESERVE_AHEAD), each that many
  -- ms from now.
  local delays = nil
  if isGlobal and n < turn and freeB > n then
    for j = n + 1, math.min(turn, freeB) do
      local at, exact = globalSlot(aheadG + j)
      if not exact or at <= now or at - now > RESERVE_AHEAD then break end
      delays = delays or {}
      delays[#delays + 1] = ceil(at - now)
    end
  end
  local granted = n
  if delays then granted = n + #delays end

  if granted < 1 then
    -- Wait. The holders ahead keep their slots; this process takes a
    -- ticket behind them, so that it is told, or knows, when its turn
    -- comes.
    if freeB < 1 and keptB > 0 and room(b, now, want + aheadB) - aheadB >= 1 then
      -- Only the slots kept for probes hold it in the bucket: look again
      -- when their answers have surely come, or they are overdue, unless
      -- the global window holds it too.
      if not isGlobal or freeG >= 1 then
        return {1, ceil(math.min(keptUntil - now, KEPT_POLL)), 0, 1, 0, name, b.limit}
      end
      freeB = 1
    end
    if freeB < 1 then
      local at = bound(b, now, aheadB)
      local wk = wakeAt(b, now)
      local overdue = 0
      if not b.known then
        -- A probe in flight: its answer opens the bucket, pushed; if it
        -- never comes (its process stopped or died), the probe is overdue
        -- at wk and the next may go.
        overdue, wk = wk, 0
      end
      if b.sliding and b.known then
        -- One slot drips at a time: the holders ahead take the first ones.
        at = math.max(at, wk) + ceil(aheadB * tau(b) / 1000)
      elseif wk > at then
        at = wk
      end
      local pushed, lower = 0, ceil(at - now)
      if at <= now and aheadB > 0 and b.known then
        -- Only a response can open it, and others are ahead: the one
        -- ahead tells it when its turn comes; its fallback is a window
        -- per window's worth of slots ahead.
        at = now + math.max(b.window, 1) * math.max(1, math.ceil(aheadB / math.max(b.limit, 1)))
        if expiresB then at = math.min(at, math.max(expiresB + 1, now + 1)) end
        lower = 0
      elseif at <= now then
        -- Only a response, or the holders ahead taking their turn, can
        -- open it: the line's head is told when.
        pushed, lower, at = 1, 0, now + pushWait
        if overdue > now then at = math.min(at, overdue) end
        -- A holder ahead keeps the room: it claims when its ticket ends
        -- at the latest, unless it stopped running; look again then.
        if aheadB > 0 and expiresB then at = math.min(at, math.max(expiresB + 1, now + 1)) end
      elseif aheadB > 0 and b.known then
        -- Behind others: the one ahead tells it when its turn comes (see
        -- the pushes at the end). Its own estimate, which windows that
        -- open late at Discord make early, is only the fallback: a window
        -- later, or when the first ticket ahead expires if sooner (its
        -- holder may have stopped running: it will tell no one).
        local est = at
        at = at + math.max(b.window, 1)
        if expiresB then at = math.min(at, math.max(est, expiresB + 1)) end
      end
      if line and aheadB > 0 then
        -- The bucket has room the holders ahead keep: they may be asleep
        -- on a turn that came sooner than they were told. Tell them, and
        -- only them: a holder behind, told, would claim, be refused by the
        -- same holders and tell this process again, and so on for as long
        -- as those sleep (a process that stopped running).
        local rn = room(b, now, MAX_PUSH)
        if rn > 0 then tellHeads(line, name, rn, posB) end
      end
      if line and worth(life, lower) then
        local it = intent(line, holder, name, b, B)
        it.want = it.want + turn
        it.at = math.max(it.at, at)
        outlive(it, life)
      end
      if isGlobal and soleG and (G.line.pos[holder] or G.line.rank[holder]) then
        -- Waiting for the bucket, it keeps no place in the global
        -- window's line: there it would keep slots it cannot use from
        -- the holders behind, who may have the bucket's room it lacks.
        lineLeave(G.line, holder)
      end
      local known = 0
      if b.known then known = b.limit end
      return {1, ceil(at - now), lower, 1, pushed, name, known}
    end
    -- The global window: its slot opens then, or (when the entry that
    -- bounds it has not answered yet) not before then.
    local at = math.max(globalSlot(aheadG + 1), now + 1)
    if line and soleB and (line.pos[holder] or line.rank[holder]) then
      -- The bucket has room for this claim: its place in the bucket's
      -- line keeps nothing it needs, and would have it told of room there
      -- that the full global window keeps it from using (and, leaving
      -- then, tell the next, who would meet the same window).
      lineLeave(line, holder)
    end
    if aheadG > 0 and glimit - G.cnt > 0 then
      -- The window has room the holders ahead keep: tell the first.
      pushGlobalHead()
    end
    if worth(life, ceil(at - now)) then
      local gt = gticket(holder)
      gt.want = gt.want + math.min(turn, freeB)
      gt.at = math.max(gt.at, at)
      outlive(gt, life)
    end
    return {1, ceil(at - now), ceil(at - now), 2, 1, 'g'}
  end

  local latest = 0
  if delays then latest = delays[#delays] end
  if kind ~= 2 then
    takeN(b, now, granted, latest + hold)
    b.pendingUntil = math.max(b.pendingUntil, now + latest + pendingTTL)
    saveBucket(B, b, bucketTTL)
    if kind == 1 then
      -- The known buckets of the major keep a slot for each probe in
      -- flight (see kept) until it is overdue, as takeN has it.
      local overdue = now + latest + hold + REPORT_SLACK
      -- (One granted before may be due later: a slot reserved ahead.)
      overdue = math.max(overdue, tonumber(redis.call('HGET', KEYS[4], ARGV[a + 7] .. '@')) or 0)
      redis.call('HINCRBY', KEYS[4], ARGV[a + 7], granted)
      redis.call('HSET', KEYS[4], ARGV[a + 7] .. '@', overdue)
      extend(KEYS[4], latest + pendingTTL + 1000)
      if overdue > c.pru then
        c.pru = overdue
        saveCred()
      end
    end
  end
  -- What this claim still waits for, and where: in the bucket's line
  -- when the bucket (or the share of it this turn takes) left no more,
  -- in the global window's otherwise.
  local rest = want - granted
  local byBucket = granted >= math.min(freeB, turnB)
  -- nextAt: when the rest may claim again, told with the grant so that it
  -- need not ask (0: at once).
  local nextAt = 0
  if isGlobal then
    local prefix = ARGV[a + 6]
    local args = {'ZADD', KEYS[3]}
    for j = 1, granted do
      local d = 0
      if j > n then d = delays[j - n] end
      args[#args + 1] = now + d + hold + UNANSWERED
      args[#args + 1] = prefix .. j
    end
    redis.call(unpack(args))
    G.cnt = G.cnt + granted
    touchGlobal(KEYS[3], c, now + latest + hold + gwindow)
    G.served = G.served + granted
    gticket(holder).served = gticket(holder).served + granted
    if rest > 0 and not byBucket then
      -- Its next slot is the one after those the holders in line keep.
      local others = lineTotal(G.line)
      local p = G.line.pos[holder]
      if p then others = others - G.line.want[p] elseif G.line.rank[holder] then others = others - average(G.line) end
      local at = math.max(globalSlot(others + granted + 1), now + latest + 1)
      nextAt = ceil(at - now)
      if worth(life, nextAt) then
        local gt = gticket(holder)
        gt.want = gt.want + math.min(rest, turnG)
        gt.at = math.max(gt.at, at)
        outlive(gt, life)
      end
    end
  end
  if subTurn then
    redis.call('HSET', KEYS[k + 7], 'busy', now + latest + pendingTTL)
    extend(KEYS[k + 7], ceil(latest + pendingTTL) + 1000)
  end
  if line then
    local it = intent(line, holder, name, b, B)
    it.served = it.served + granted
    if rest > 0 and byBucket then
      -- Served in part by the bucket: the rest goes to the back, behind
      -- every other holder.
      local others = lineTotal(line)
      local p = line.pos[holder]
      if p then others = others - line.want[p] elseif line.rank[holder] then others = others - average(line) end
      local at = bound(b, now, others)
      if b.sliding and b.known then at = math.max(at, wakeAt(b, now)) + ceil(others * tau(b) / 1000) end
      if at > now then nextAt = ceil(at - now) end
      if worth(life, nextAt) then
        it.want = it.want + math.min(rest, turnB)
        it.at = math.max(it.at, at, now + latest + 1)
        outlive(it, life)
      end
    end
  end
  replyOf[i] = {granted, kind}
  local limit = 0
  if b.known then limit = b.limit end
  if not delays then return {0, granted, kind, limit, nextAt, 0} end
  local out = {0, granted, kind, limit, nextAt, #delays}
  for _, d in ipairs(delays) do out[#out + 1] = d end
  return out
end

local function undoLost(ki, ai)
  -- Undone calls: calls of this process whose replies were lost, each
  -- {number, claims} in ARGV followed by UNDO_ARGS per claim. The one that
  -- ran last (the one this process's record names) gives back what each of
  -- its claims was granted: nothing since has settled those slots. An
  -- earlier one that ran was undone by a later one, which carried it too.
  --
  -- Keys per claim: bucket, pbucket (as the claim named them). Arguments:
  -- permit id prefix, major digest, global (1/0).
  for _ = 1, undoCalls do
    local no, claims = tonumber(ARGV[ai]), tonumber(ARGV[ai + 1])
    ai = ai + 2
    local grants = {}
    if no == proc.call then
      -- The record's grants: "claim/count/kind" per claim that was granted.
      for i, n, kind in string.gmatch(proc.grants, '(%d+)/(%d+)/(%d)') do
        grants[tonumber(i)] = {tonumber(n), tonumber(kind)}
      end
    end
    for i = 1, claims do
      local g = grants[i]
      local n, kind = 0, 2
      if g then n, kind = g[1], g[2] end
      if n > 0 then
        local key = KEYS[ki]
        if kind == 1 then key = KEYS[ki + 1] end
        if kind ~= 2 then
          local b = loadBucket(key, kind)
          for _ = 1, n do giveBack(b, now) end
          saveBucket(key, b, bucketTTL)
        end
        if kind == 1 then unprobe(ARGV[ai + 1], n) end
        if ARGV[ai + 2] == '1' then
          local members = {}
          for j = 1, n do members[j] = ARGV[ai] .. j end
          chunked('ZREM', {KEYS[3]}, members)
        end
      end
      ki, ai = ki + UNDO_KEYS, ai + UNDO_ARGS
    end
  end
  return ki, ai
end

local function applyReports(reply, ki, ai)
  for _ = 1, nReports do
    local seq = tonumber(ARGV[ai])
    if seq > proc.report then
      reply[#reply + 1] = update(ki, ai + 1)
      lastReport = math.max(lastReport, seq)
    else
      reply[#reply + 1] = -1
    end
    ki, ai = ki + REPORT_KEYS, ai + 1 + REPORT_ARGS
  end
  return ki, ai
end

local function answerClaims(reply, ki, ai)
  reply[#reply + 1] = nClaims
  for i = 1, nClaims do
    local r = claim(i, ki, ai)
    reply[#reply + 1] = #r
    for _, x in ipairs(r) do reply[#reply + 1] = x end
    ki, ai = ki + CLAIM_KEYS, ai + CLAIM_ARGS
  end
  return ki, ai
end

local function placeTickets()
  -- Tickets: a process waits in a line with one ticket for what its claims
  -- of this call still want; one served in part goes to the back. The
  -- bucket, or the credential for the global window, keeps until when its
  -- line may hold tickets, so that no line is read while nobody waits.
  for _, key in ipairs(intentOrder) do
    local it = intents[key]
    if it.want > 0 then
      local expiry = it.at + grace
      if it.life > 0 then expiry = math.min(expiry, now + it.life) end
      lineJoin(it.line, it.holder, it.want, expiry, owner(it.holder) ~= it.holder, it.served > 0)
      if expiry > it.b.lineUntil then
        it.b.lineUntil = expiry
        saveBucket(it.bkey, it.b, bucketTTL)
      end
    else
      lineLeave(it.line, it.holder)
    end
  end
  if G then
    for holder, t in pairs(G.tix) do
      if t.want > 0 then
        local expiry = t.at + grace
        if t.life > 0 then expiry = math.min(expiry, now + t.life) end
        lineJoin(G.line, holder, t.want, expiry, owner(holder) ~= holder, t.served > 0)
        local c = loadCred(KEYS[2])
        if expiry > c.glu then
          c.glu = expiry
          saveCred()
        end
      else
        lineLeave(G.line, holder)
      end
    end
  end

end

local function leaveLines(ki, ai)
  -- Lines left: a process told its turn had come in a line whose queues
  -- had no waiter left gives its place up, rather than keep the others
  -- waiting for it. Keys: the line and its tickets, and the bucket (the
  -- global window's line has its own keys). Argument: the line's name
  -- ('g' for the global window's).
  for _ = 1, nLeaves do
    local name = ARGV[ai]
    if name == 'g' then
      local c = loadCred(KEYS[2])
      if c.glu > now then
        globalLoad(c)
        if not G.tix[me] then lineLeave(G.line, me) end
        if not G.tix[me .. '!'] then lineLeave(G.line, me .. '!') end
        G.lowered = true
      end
    else
      local b = loadBucket(KEYS[ki + 2], 0)
      if b.lineUntil > now then
        local line = lineLoad(KEYS[ki], KEYS[ki + 1])
        if not intents[line.L .. '\0' .. me] then lineLeave(line, me) end
        if not intents[line.L .. '\0' .. me .. '!'] then lineLeave(line, me .. '!') end
        local w = watch(KEYS[ki + 2], KEYS[ki], KEYS[ki + 1], name)
        w.left = true
      end
    end
    ki, ai = ki + LEAVE_KEYS, ai + LEAVE_ARGS
  end

end

local function sendPushes()
  -- Pushes: a line whose counter has room now (a response opened it, or
  -- this process was served and left some) tells its first holders.
  for _, key in ipairs(watchOrder) do
    local w = watched[key]
    if w.retired then
      tellHeads(lineLoad(w.lk, w.lt), w.name, 4 * MAX_PUSH, nil, w.hash)
    elseif w.left then
      -- The turn this process gave up: the next holder's.
      local b, line = buckets[key].b, lineLoad(w.lk, w.lt)
      local rn = room(b, now, MAX_PUSH)
      if rn > 0 then
        tellHeads(line, w.name, rn)
      else
        local nxt = firstOther(line, me)
        local at = math.max(bound(b, now, 0), wakeAt(b, now))
        if nxt and at > now then
          push(chan, tag, owner(nxt), w.name, at - now)
          lineRetime(line, nxt, at + grace)
        elseif nxt then
          push(chan, tag, owner(nxt), w.name, 0)
        end
      end
    elseif w.opened then
      local rn = room(buckets[key].b, now, MAX_PUSH)
      if rn > 0 then
        tellHeads(lineLoad(w.lk, w.lt), w.name, rn)
      elseif w.before and w.before > 0 then
        -- A response moved when the closed bucket reopens (its reset,
        -- known now, where the grant of its window's first request had
        -- estimated it): the first holder of its line, told the estimate
        -- as its turn, is told the reopening, so that it claims once,
        -- then. (This process, first, learns it from the call's reply.)
        local at = reopen(buckets[key].b)
        if at > now and at ~= w.before then
          local line = lineLoad(w.lk, w.lt)
          local first = line.ids[1]
          if first and owner(first) ~= me then
            push(chan, tag, owner(first), w.name, at - now)
            lineRetime(line, first, at + grace)
          end
        end
      end
    end
  end
  for _, key in ipairs(intentOrder) do
    local it = intents[key]
    if it.served > 0 and lineOthers(it.line, me) then
      -- This process took its turn: the next holders' comes now when the
      -- bucket has room left, or when it opens again, which they may have
      -- been told was later (the turn this process took was shorter than
      -- it waited for).
      local rn = room(it.b, now, MAX_PUSH)
      if rn > 0 then
        tellHeads(it.line, it.name, rn)
      else
        local nxt = firstOther(it.line, me)
        local at = math.max(bound(it.b, now, 0), wakeAt(it.b, now))
        if at > now then
          push(chan, tag, owner(nxt), it.name, at - now)
          lineRetime(it.line, nxt, at + grace)
        end
      end
    end
  end
  if G and (G.lowered or G.served > 0) then pushGlobalHead() end

end

-- stepMain runs one call: begin (common.lua) has set KEYS, ARGV and now.
local function stepMain()
  callNo, undoCalls, nLeaves = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  me, chan = ARGV[4], ARGV[5]
  nReports, nClaims = tonumber(ARGV[6]), tonumber(ARGV[7])
  glimit, gwindow, hold = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
  pendingTTL, bucketTTL, routeTTL = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
  grace, pushWait, tag = tonumber(ARGV[14]), tonumber(ARGV[15]), ARGV[16]
  G, watched, watchOrder, replyOf, intents, intentOrder = nil, {}, {}, {}, {}, {}

  -- The record: "call:report:grants", grants as "claim/count/kind" for
  -- each claim of the call that was granted.
  proc = {call = 0, report = -1, grants = ''}
  local v = redis.call('GET', KEYS[5])
  if v then
    local c, r, g = string.match(v, '^(%d+):(%-?%d+):(.*)$')
    if c then proc.call, proc.report, proc.grants = tonumber(c), tonumber(r), g end
  end
  if callNo <= proc.call then return {-1} end
  lastReport = proc.report

  local ki, ai = undoLost(8, CALL_ARGS + 1)
  local reply = {1, nReports}
  ki, ai = applyReports(reply, ki, ai)
  ki, ai = answerClaims(reply, ki, ai)
  placeTickets()
  leaveLines(ki, ai)
  sendPushes()

  local record = string.format('%d:%d:', callNo, lastReport)
  for i = 1, nClaims do
    local g = replyOf[i]
    if g then record = record .. i .. '/' .. g[1] .. '/' .. g[2] .. ' ' end
  end
  redis.call('SET', KEYS[5], record, 'PX', PROC_TTL)
  flush()
  return reply
end
