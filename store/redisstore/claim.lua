-- claim: may up to n requests of one (credential, route, major) go now?
--
-- KEYS (all share the credential's hash tag):
--   1 routes    HASH  route template -> learned bucket hash, or "\0" (no bucket)
--   2 cred      HASH  gpause, blocked, unauth (Redis-time deadlines, ms)
--   3 global    ZSET  global-window entries: permit id -> latest arrival (ms)
--   4 invalid   HASH  10-second slot index -> invalid responses in it
--   5 dead      STRING present while a token-authenticated major is refused
--   6 bucket    HASH  state of the bucket the caller resolved (learned or no-bucket)
--   7 pending   ZSET  its granted, unreported permits -> expiry (ms)
--   8 tickets   ZSET  its waiting process queues -> arrival (ms)
--   9 ticketexp ZSET  the same queues -> expiry (ms)
--  10 pbucket   HASH  the probe bucket of (route, major)
--  11 ppending  ZSET  its pending permits
-- ARGV:
--   1 route template        2 caller's guess of the route's hash ("" unknown, "\0" none)
--   3 global (1/0)          4 global limit            5 global window (ms)
--   6 offset (ms)           7 invalid budget (<= 0: off)
--   8 token auth (1/0)      9 slots wanted (>= 1)     10 permit id prefix
--  11 pending timeout (ms) 12 queue id               13 poll interval (ms)
--  14 bucket TTL (ms)      15 route TTL (ms)
-- Reply, always an array whose first element is the kind:
--   {0, granted, bucket kind (0 learned, 1 probe, 2 none), holds a ticket (1/0), delay ms}
--      a delay > 0 reserves one slot: the request may go that much later
--   {1, sleep ms, lower bound ms (0: unknown), scope (1 user, 2 global, 3 shared)[, holds a ticket]}
--   {2, retry ms, reason (1 invalid budget, 2 unauthorized, 3 webhook gone)}
--   {3, hash}  the route is learned otherwise: call again with these keys

-- now, ceil and extend come from common.lua, prepended when loading.

local route, guess = ARGV[1], ARGV[2]
local isGlobal = ARGV[3] == '1'
local glimit, gwindow = tonumber(ARGV[4]), tonumber(ARGV[5])
local offset, budget = tonumber(ARGV[6]), tonumber(ARGV[7])
local tokenAuth = ARGV[8] == '1'
local want, prefix = tonumber(ARGV[9]), ARGV[10]
local pendingTTL, qid = tonumber(ARGV[11]), ARGV[12]
local poll, bucketTTL, routeTTL = tonumber(ARGV[13]), tonumber(ARGV[14]), tonumber(ARGV[15])

-- The invalid-request guard, counted per credential in 10-second slots.
if budget > 0 then
  local slots = redis.call('HGETALL', KEYS[4])
  local cur = math.floor(now / 10000)
  local n, oldest = 0, nil
  for i = 1, #slots, 2 do
    local idx, c = tonumber(slots[i]), tonumber(slots[i + 1])
    if idx and c and cur - idx <= 60 then
      n = n + c
      if oldest == nil or idx < oldest then oldest = idx end
    end
  end
  if n >= budget then
    return {2, ceil((oldest + 61) * 10000 - now), 1}
  end
end

local cf = redis.call('HMGET', KEYS[2], 'gpause', 'blocked', 'unauth')
local gpause = tonumber(cf[1]) or 0
local blocked = tonumber(cf[2]) or 0
local unauth = tonumber(cf[3]) or 0

if tokenAuth then
  local ttl = redis.call('PTTL', KEYS[5])
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

local B, P = KEYS[6], KEYS[7]
local kind = 0
local fields = {'known', 'limit', 'remaining', 'reset', 'window', 'pause', 'retired', 'est'}
local f
if r == '' then
  kind, B, P = 1, KEYS[10], KEYS[11]
elseif r == '\0' then
  kind = 2
else
  -- A hash holds at least one of these fields or does not exist.
  f = redis.call('HMGET', B, unpack(fields))
  if not (f[1] or f[2] or f[3] or f[4] or f[5] or f[6] or f[7] or f[8]) then
    -- The route was learned on another major while this major's probe
    -- is still in flight: wait for that probe's answer.
    redis.call('ZREMRANGEBYSCORE', KEYS[11], '-inf', now)
    if redis.call('ZCARD', KEYS[11]) > 0 then
      kind, B, P = 1, KEYS[10], KEYS[11]
      f = nil
    end
  end
end

if not f then f = redis.call('HMGET', B, unpack(fields)) end
local known = f[1] == '1'
local limit = tonumber(f[2]) or 0
local remaining = tonumber(f[3]) or 0
local reset = tonumber(f[4]) or 0
local window = tonumber(f[5]) or 0
local pause = tonumber(f[6]) or 0
local retired = f[7] == '1'

local hold = pause
local holdScope = 3
if blocked > hold then hold, holdScope = blocked, 1 end
if hold > now then
  local w = ceil(hold - now)
  return {1, w, w, holdScope}
end
if retired then return {1, poll, 0, 1} end

-- The count of unexpired pending permits, read when first needed.
local pending
local function pendingCount()
  if pending == nil then
    pending = 0
    if kind ~= 2 then
      redis.call('ZREMRANGEBYSCORE', P, '-inf', now)
      pending = redis.call('ZCARD', P)
    end
  end
  return pending
end

local avail
local dirty = false
local useTickets = false
local ahead, behind = 0, 1
local rank = false
if kind == 2 then
  avail = want
elseif not known then
  -- A probe: one request at a time until a response names the limits.
  if pendingCount() > 0 then return {1, poll, 0, 1} end
  avail = 1
else
  if reset > 0 and now >= reset and pendingCount() == 0 then
    remaining, reset, dirty = limit, 0, true
  end
  if kind == 0 then
    -- Tickets: process queues that were refused, in arrival order. Each
    -- one ahead keeps a slot; what is left is shared with those behind.
    useTickets = true
    -- The line holds the same queues as their expiries: an empty line
    -- has nothing to expire.
    local m = redis.call('ZCARD', KEYS[8])
    if m > 0 then
      local gone = redis.call('ZRANGEBYSCORE', KEYS[9], '-inf', now)
      if #gone > 0 then
        for i = 1, #gone, 1000 do
          local j = math.min(i + 999, #gone)
          redis.call('ZREM', KEYS[9], unpack(gone, i, j))
          redis.call('ZREM', KEYS[8], unpack(gone, i, j))
        end
        m = redis.call('ZCARD', KEYS[8])
      end
      rank = m > 0 and redis.call('ZRANK', KEYS[8], qid)
    end
    if rank then
      ahead, behind = rank, m - rank
    else
      ahead, behind = m, 1
    end
  end
  avail = remaining - ahead
  if avail <= 0 then
    local sleep, bound
    if remaining > 0 then
      sleep, bound = poll, 0
    elseif reset > now then
      bound = ceil(reset - now)
      sleep = bound
      if limit > 0 and window > 0 then
        sleep = sleep + math.floor(ahead / limit) * window
      end
      if pendingCount() > 0 then sleep = bound end
    else
      sleep, bound = poll, 0
    end
    if useTickets then
      if not rank then redis.call('ZADD', KEYS[8], now, qid) end
      local exp = now + sleep + poll + 1000
      redis.call('ZADD', KEYS[9], exp, qid)
      local keep = ceil(exp - now) + 1000
      extend(KEYS[8], keep)
      extend(KEYS[9], keep)
    end
    if dirty then
      redis.call('HSET', B, 'remaining', remaining, 'reset', reset)
    end
    if useTickets then return {1, sleep, bound, 1, 1} end
    return {1, sleep, bound, 1, 0}
  end
  avail = math.ceil(avail / behind)
end

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
  local free = glimit - cnt
  if free <= 0 then
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
      if dirty then
        redis.call('HSET', B, 'remaining', remaining, 'reset', reset)
      end
      return {1, w, w, 2}
    end
    -- Its request has answered, so the moment is exact: reserve that
    -- slot. Grants decided later count this entry and cannot take it, so
    -- the waiters of every process are served in the order they
    -- claimed, each with a single claim.
    delay = ceil(at - now)
    k = 1
  elseif k > free then
    k = free
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
  zaddEach(P, now + delay + pendingTTL, k)
  -- Each update removes its permit: P is often new.
  extend(P, delay + pendingTTL + 1000, true)
end
if known and kind ~= 2 then
  remaining = remaining - k
  if reset == 0 then
    reset = now + delay + window
    redis.call('HSET', B, 'remaining', remaining, 'reset', reset, 'est', 1)
    dirty = false
  else
    dirty = true
  end
end
if dirty then
  redis.call('HSET', B, 'remaining', remaining, 'reset', reset)
end
if kind ~= 2 or dirty then
  local keep = bucketTTL
  local last = math.max(reset, pause)
  if last > now then keep = keep + ceil(last - now) end
  redis.call('PEXPIRE', B, keep)
end

local ticket = 0
if useTickets then
  if want > k then
    ticket = 1
    -- Served in part: go to the back of the line.
    redis.call('ZADD', KEYS[8], now, qid)
    redis.call('ZADD', KEYS[9], now + poll + 1000, qid)
    extend(KEYS[8], poll + 2000)
    extend(KEYS[9], poll + 2000)
  elseif rank then
    redis.call('ZREM', KEYS[8], qid)
    redis.call('ZREM', KEYS[9], qid)
  end
end

return {0, k, kind, ticket, delay}
