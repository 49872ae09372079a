-- claim: may up to n requests of one (credential, route, major) go now?
--
-- KEYS (all share the credential's hash tag):
--   1 routes    HASH  route template -> learned bucket hash, or "\0" (no bucket)
--   2 cred      HASH  gpause, blocked, unauth (Redis-time deadlines, ms)
--   3 global    ZSET  global-window entries: permit id -> latest arrival (ms)
--   4 dead      STRING present while a token-authenticated major is refused
--   5 bucket    STRING the model state of the bucket the caller resolved (learned or no-bucket)
--   6 tickets   ZSET  its waiting process queues -> arrival (ms)
--   7 ticketexp ZSET  the same queues -> expiry (ms)
--   8 pbucket   STRING the model state of the probe bucket of (route, major)
--   9 probes    HASH  major digest -> probe requests in flight
-- ARGV:
--   1 route template        2 caller's guess of the route's hash ("" unknown, "\0" none)
--   3 global (1/0)          4 global limit            5 global window (ms)
--   6 offset (ms)           7 token auth (1/0)        8 slots wanted (>= 1)
--   9 permit id prefix     10 pending timeout (ms)   11 queue id
--  12 poll interval (ms)   13 bucket TTL (ms)        14 route TTL (ms)
--  15 major digest         16 clock (ms, 0: Redis TIME)
-- The invalid-request guard is not the script's: it counts per store (an
-- IP address), on a key of its own (see invalid.lua).
-- Reply, always an array whose first element is the kind:
--   {0, granted, bucket kind (0 learned, 1 probe, 2 none), holds a ticket (1/0), delay ms}
--      a delay > 0 reserves one slot: the request may go that much later
--   {1, sleep ms, lower bound ms (0: unknown), scope (1 user, 2 global, 3 shared)[, holds a ticket]}
--   {2, retry ms, reason (2 unauthorized, 3 webhook gone)}
--   {3, hash}  the route is learned otherwise: call again with these keys

-- now, ceil, extend, loadBucket, saveBucket and the model come from
-- common.lua and model.lua, prepended when loading.

local route, guess = ARGV[1], ARGV[2]
local isGlobal = ARGV[3] == '1'
local glimit, gwindow = tonumber(ARGV[4]), tonumber(ARGV[5])
local offset = tonumber(ARGV[6])
local tokenAuth = ARGV[7] == '1'
local want, prefix = tonumber(ARGV[8]), ARGV[9]
local pendingTTL, qid = tonumber(ARGV[10]), ARGV[11]
local poll, bucketTTL, routeTTL = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local majorDigest = ARGV[15]

local cf = redis.call('HMGET', KEYS[2], 'gpause', 'blocked', 'unauth')
local gpause = tonumber(cf[1]) or 0
local blocked = tonumber(cf[2]) or 0
local unauth = tonumber(cf[3]) or 0

if tokenAuth then
  local ttl = redis.call('PTTL', KEYS[4])
  if ttl > 0 then return {2, ttl, 3} end
elseif unauth > now then
  return {2, ceil(unauth - now), 2}
end

-- Resolve the route. The caller named the keys of the bucket it expects;
-- when the route maps elsewhere it must call again with the right keys.
local r = redis.call('HGET', KEYS[1], route)
if not r then r = '' end
if r ~= guess then return {3, r} end
if r ~= '' then redis.call('PEXPIRE', KEYS[1], routeTTL) end

local B = KEYS[5]
local kind = 0
local b, found
if r == '' then
  kind, B = 1, KEYS[8]
elseif r == '\0' then
  kind = 2
end
b, found = loadBucket(B, kind)
if kind == 0 and not found then
  -- The route was learned on another major while this major's probe
  -- is still in flight: wait for that probe's answer.
  local pb = loadBucket(KEYS[8], 1)
  if pb.pending > 0 then kind, B, b = 1, KEYS[8], pb end
end

if not available(b, now, blocked) and (now < b.pause or now < blocked) then
  local scope = 3
  if blocked > b.pause then scope = 1 end
  local w = ceil(math.max(b.pause, blocked) - now)
  return {1, w, w, scope}
end

-- Tickets: process queues that were refused on a learned bucket, in
-- arrival order. Each one ahead keeps a slot; what is left is shared with
-- those behind.
local useTickets = kind == 0
local ahead, behind, rank = 0, 1, false
if useTickets then
  -- The line holds the same queues as their expiries: an empty line has
  -- nothing to expire.
  local m = redis.call('ZCARD', KEYS[6])
  if m > 0 then
    local gone = redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', now)
    if #gone > 0 then
      for i = 1, #gone, 1000 do
        local j = math.min(i + 999, #gone)
        redis.call('ZREM', KEYS[7], unpack(gone, i, j))
        redis.call('ZREM', KEYS[6], unpack(gone, i, j))
      end
      m = redis.call('ZCARD', KEYS[6])
    end
    rank = m > 0 and redis.call('ZRANK', KEYS[6], qid)
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
  while free < want + ahead and available(probe, now, blocked) do
    take(probe, now)
    free = free + 1
  end
end
local avail = free - ahead
if avail <= 0 then
  local sleep, lower = poll, 0
  local wk = wakeAt(b, now, blocked)
  if wk > 0 and (free == 0 or b.remaining <= 0) then
    lower = ceil(bound(b, now, blocked, ahead) - now)
    sleep = math.max(ceil(wk - now), lower)
    if b.sliding then
      -- One slot drips at a time: the queues ahead take the first ones.
      sleep = sleep + ceil(ahead * tau(b) / 1000)
    end
  end
  if useTickets then
    if not rank then redis.call('ZADD', KEYS[6], now, qid) end
    local exp = now + sleep + poll + 1000
    redis.call('ZADD', KEYS[7], exp, qid)
    local keep = ceil(exp - now) + 1000
    extend(KEYS[6], keep)
    extend(KEYS[7], keep)
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
local delay = 0

if isGlobal then
  local gp = math.max(gpause, blocked)
  if gp > now then
    local w = ceil(gp - now)
    return {1, w, w, 2}
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - gwindow)
  local cnt = redis.call('ZCARD', KEYS[3])
  local gfree = glimit - cnt
  if gfree <= 0 then
    -- The window is full. A grant at moment T is allowed when fewer than
    -- glimit entries lie after T - gwindow, so the first slot opens
    -- gwindow after the entry glimit places from the end.
    local e = redis.call('ZRANGE', KEYS[3], cnt - glimit, cnt - glimit, 'WITHSCORES')
    local at = now + 1
    if e[2] then at = tonumber(e[2]) + gwindow end
    if not e[2] or tonumber(e[2]) > now then
      -- That entry's request has not answered yet: its slot may open
      -- earlier than its score says. Wait and ask again.
      local w = ceil(at - now)
      return {1, w, w, 2}
    end
    -- Its request has answered, so the moment is exact: reserve that
    -- slot. Grants decided later count this entry and cannot take it, so
    -- the waiters of every process are served in the order they
    -- claimed, each with a single claim.
    delay = ceil(at - now)
    k = 1
  elseif k > gfree then
    k = gfree
  end
  zaddEach(KEYS[3], now + delay + offset, k)
  -- Every key gets a TTL when created: one that held entries has one.
  if cnt > 0 then
    redis.call('PEXPIRE', KEYS[3], ceil(delay + offset + gwindow) + 1000, 'GT')
  else
    redis.call('PEXPIRE', KEYS[3], ceil(delay + offset + gwindow) + 1000)
  end
end

if kind ~= 2 then
  for _ = 1, k do take(b, now) end
  b.pendingUntil = now + delay + pendingTTL
  saveBucket(B, b, bucketTTL)
  if kind == 1 then
    redis.call('HINCRBY', KEYS[9], majorDigest, k)
    extend(KEYS[9], delay + pendingTTL + 1000)
  end
end

local ticket = 0
if useTickets then
  if want > k then
    ticket = 1
    -- Served in part: go to the back of the line.
    redis.call('ZADD', KEYS[6], now, qid)
    redis.call('ZADD', KEYS[7], now + poll + 1000, qid)
    extend(KEYS[6], poll + 2000)
    extend(KEYS[7], poll + 2000)
  elseif rank then
    redis.call('ZREM', KEYS[6], qid)
    redis.call('ZREM', KEYS[7], qid)
  end
end

return {0, k, kind, ticket, delay}
