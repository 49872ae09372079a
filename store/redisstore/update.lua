-- update: apply what the response to one permit taught.
--
-- KEYS (all share the credential's hash tag):
--   1 routes   HASH  route template -> learned bucket hash, or "\0"
--   2 cred     HASH  gpause, blocked, unauth
--   3 global   ZSET  global-window entries
--   4 invalid  HASH  10-second slot index -> invalid responses
--   5 dead     STRING the token-authenticated major's cooldown
--   6 gbucket  HASH  the bucket the permit was granted from
--   7 gpending ZSET  its pending permits
--   8 tbucket  HASH  the bucket the response names (the same as 6 when it
--                    names none)
-- ARGV:
--   1 route template    2 permit id ("" when none)   3 sent (1/0)
--   4 status            5 response bucket hash       6 has limit (1/0)
--   7 limit             8 remaining                  9 reset after (ms, < 0 unknown)
--  10 scope            11 retry (ms, offset included) 12 offset (ms)
--  13 cooldown (ms, < 0 disabled)                   14 token auth (1/0)
--  15 granted kind (0 learned, 1 probe, 2 none)     16 granted hash
--  17 global (1/0)     18 bucket TTL (ms)           19 route TTL (ms)
-- Reply: {1, wake}: how many ms from now the bucket the response concerns
-- may grant again by the passing of time alone (0: now), or -1 when only a
-- response can open it or it is unknown.

-- now, ceil and extend come from common.lua, prepended when loading.

local route, member = ARGV[1], ARGV[2]
local sent = ARGV[3] == '1'
local status = tonumber(ARGV[4])
local ubucket = ARGV[5]
local hasLimit = ARGV[6] == '1'
local ulimit, uremaining = tonumber(ARGV[7]), tonumber(ARGV[8])
local resetAfter = tonumber(ARGV[9])
local scope = ARGV[10]
local retry, offset = tonumber(ARGV[11]), tonumber(ARGV[12])
local cooldown = tonumber(ARGV[13])
local tokenAuth = ARGV[14] == '1'
local gkind, ghash = tonumber(ARGV[15]), ARGV[16]
local isGlobal = ARGV[17] == '1'
local bucketTTL, routeTTL = tonumber(ARGV[18]), tonumber(ARGV[19])

local GB, GP, TB = KEYS[6], KEYS[7], KEYS[8]

-- wakeOf returns in how many ms bucket B (with pending set P, when known)
-- may grant by the passing of time alone: 0 for now, -1 when only a
-- response can open it. When keep is true, it also makes B live until
-- bucketTTL after its reset or pause (a missing B stays missing). f, when
-- given, holds B's known, remaining, reset, pause and retired fields as
-- they are now.
local function wakeOf(B, P, keep, f)
  if not B then return -1 end
  if not f then f = redis.call('HMGET', B, 'known', 'remaining', 'reset', 'pause', 'retired') end
  local pause = tonumber(f[4]) or 0
  local reset = tonumber(f[3]) or 0
  if keep then
    local last = math.max(reset, pause)
    local ms = bucketTTL
    if last > now then ms = ms + ceil(last - now) end
    redis.call('PEXPIRE', B, ms)
  end
  if f[5] == '1' then return -1 end
  if pause > now then return ceil(pause - now) end
  local function idle()
    if not P then return false end
    redis.call('ZREMRANGEBYSCORE', P, '-inf', now)
    return redis.call('ZCARD', P) == 0
  end
  if f[1] ~= '1' then
    if idle() then return 0 end
    return -1
  end
  if (tonumber(f[2]) or 0) > 0 then return 0 end
  if reset > now then return ceil(reset - now) end
  if idle() then return 0 end
  return -1
end

local function keepBucket(B)
  local f = redis.call('HMGET', B, 'reset', 'pause')
  local last = math.max(tonumber(f[1]) or 0, tonumber(f[2]) or 0)
  local keep = bucketTTL
  if last > now then keep = keep + ceil(last - now) end
  redis.call('PEXPIRE', B, keep)
end

if not sent then
  -- Never sent: give back the slot, once.
  if member ~= '' then
    if isGlobal then redis.call('ZREM', KEYS[3], member) end
    if redis.call('ZREM', GP, member) == 1 then
      local f = redis.call('HMGET', GB, 'known', 'limit', 'remaining')
      local limit, remaining = tonumber(f[2]) or 0, tonumber(f[3]) or 0
      if f[1] == '1' and remaining < limit then
        redis.call('HINCRBY', GB, 'remaining', 1)
      end
    end
  end
  return {1, wakeOf(GB, GP)}
end

if member ~= '' then
  redis.call('ZREM', GP, member)
  if isGlobal then
    -- The request reached Discord by now: its global slot counts from no
    -- later than this.
    redis.call('ZADD', KEYS[3], 'XX', 'LT', now, member)
  end
end

-- What the response teaches about the route.
local target = GB
if gkind ~= 0 or ubucket == '' or ghash ~= ubucket then
  local r = redis.call('HGET', KEYS[1], route)
  if not r then r = '' end
  if ubucket ~= '' then
    if r ~= ubucket then
      redis.call('HSET', KEYS[1], route, ubucket)
      if gkind == 1 then redis.call('HSET', GB, 'retired', 1) end
    end
    target = TB
  elseif status >= 200 and status < 300 and not hasLimit and (r == '' or r == '\0') then
    -- Answered without rate-limit headers: bound by the global limit only.
    if r ~= '\0' then redis.call('HSET', KEYS[1], route, '\0') end
    if gkind == 1 then redis.call('HSET', GB, 'retired', 1) end
    target = nil
  end
  redis.call('PEXPIRE', KEYS[1], routeTTL)
end

-- The credential's deadlines matter only to the responses that may change
-- them.
local gpause, blocked, unauth = 0, 0, 0
if status == 429 or status == 401 then
  local cf = redis.call('HMGET', KEYS[2], 'gpause', 'blocked', 'unauth')
  gpause = tonumber(cf[1]) or 0
  blocked = tonumber(cf[2]) or 0
  unauth = tonumber(cf[3]) or 0
end
local credDirty = false

-- observe applies rate-limit headers to bucket B. Within a window the
-- remaining count only goes down and the reset only moves later. It
-- returns B's fields as wakeOf reads them.
local function observe(B)
  local f = redis.call('HMGET', B, 'known', 'limit', 'remaining', 'reset', 'window', 'est', 'pause', 'retired')
  local known = f[1] == '1'
  local limit = tonumber(f[2]) or 0
  local remaining = tonumber(f[3]) or 0
  local reset = tonumber(f[4]) or 0
  local window = tonumber(f[5]) or 0
  local est = f[6] == '1'
  local after = resetAfter
  if after < 0 then after = math.max(window, 1000) end
  local newReset = now + after + offset
  if not known then
    redis.call('HSET', B, 'known', 1, 'limit', ulimit, 'remaining', uremaining,
      'reset', newReset, 'window', newReset - now, 'est', 0)
    return {'1', uremaining, newReset, f[7], f[8]}
  end
  if ulimit > limit then remaining = remaining + ulimit - limit end
  if uremaining < remaining then remaining = uremaining end
  if est or reset == 0 or newReset > reset then
    reset, est = newReset, false
  end
  if newReset - now > window then window = newReset - now end
  redis.call('HSET', B, 'limit', ulimit, 'remaining', remaining, 'reset', reset,
    'window', window, 'est', est and 1 or 0)
  return {'1', remaining, reset, f[7], f[8]}
end

local function later(a, b)
  if b > a then return b end
  return a
end

-- target's fields, when known without reading them again.
local seen
if status == 429 then
  if scope == 'global' then
    gpause, credDirty = later(gpause, now + retry), true
  elseif scope == 'shared' then
    if target then
      local p = tonumber(redis.call('HGET', target, 'pause')) or 0
      redis.call('HSET', target, 'pause', later(p, now + retry))
    end
  elseif scope == 'blocked' then
    blocked = later(blocked, now + retry)
    gpause = later(gpause, blocked)
    credDirty = true
  else
    if target then
      if hasLimit then observe(target) end
      local f = redis.call('HMGET', target, 'pause', 'known', 'reset')
      local p = later(tonumber(f[1]) or 0, now + retry)
      redis.call('HSET', target, 'pause', p)
      if f[2] == '1' then
        redis.call('HSET', target, 'remaining', 0)
        if (tonumber(f[3]) or 0) < p then
          redis.call('HSET', target, 'reset', p, 'est', 0)
        end
      end
    else
      gpause, credDirty = later(gpause, now + retry), true
    end
  end
elseif hasLimit and target then
  seen = observe(target)
end

-- The invalid-request guard and the 401/404 cooldowns.
if status == 401 or status == 403 or (status == 429 and scope ~= 'shared') then
  local slot = math.floor(now / 10000)
  redis.call('HINCRBY', KEYS[4], slot, 1)
  local fields = redis.call('HKEYS', KEYS[4])
  for i = 1, #fields do
    local idx = tonumber(fields[i])
    if idx == nil or slot - idx > 60 then redis.call('HDEL', KEYS[4], fields[i]) end
  end
  extend(KEYS[4], 620000)
end
if cooldown >= 0 then
  if tokenAuth and (status == 401 or status == 404) then
    redis.call('SET', KEYS[5], 1, 'PX', math.max(1, ceil(cooldown)))
  elseif not tokenAuth and status == 401 then
    unauth, credDirty = now + cooldown, true
  end
end

if credDirty then
  redis.call('HSET', KEYS[2], 'gpause', gpause, 'blocked', blocked, 'unauth', unauth)
  local last = math.max(gpause, blocked, unauth)
  extend(KEYS[2], ceil(last - now) + 1000)
end

-- extend leaves a missing key alone.
if target == GB then return {1, wakeOf(GB, GP, true, seen)} end
keepBucket(GB)
return {1, wakeOf(target, nil, true, seen)}
