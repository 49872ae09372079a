-- update: apply what the response to one permit taught.
--
-- KEYS (all share the credential's hash tag):
--   1 routes   HASH  route template -> learned bucket hash, or "\0"
--   2 cred     HASH  gpause, blocked, unauth
--   3 global   ZSET  global-window entries
--   4 dead     STRING the token-authenticated major's cooldown
--   5 gbucket  STRING the model state of the bucket the permit was granted from
--   6 tbucket  STRING the bucket the response names (the same as 5 when it
--                    names none)
--   7 probes   HASH  major digest -> probe requests in flight
-- ARGV:
--   1 route template    2 permit id ("" when none)   3 sent (1/0)
--   4 status            5 response bucket hash       6 has limit (1/0)
--   7 limit             8 remaining                  9 reset after (ms, < 0 unknown)
--  10 scope            11 retry (ms, offset included) 12 offset (ms)
--  13 cooldown (ms, < 0 disabled)                   14 token auth (1/0)
--  15 granted kind (0 learned, 1 probe, 2 none, -1 no permit)
--  16 granted hash     17 global (1/0)              18 bucket TTL (ms)
--  19 route TTL (ms)   20 major digest              21 clock (ms, 0: Redis TIME)
-- Reply: {1, wake}: how many ms from now the bucket the response concerns
-- may grant again by the passing of time alone (0: now), or -1 when only a
-- response can open it or it is unknown.

-- now, ceil, extend, loadBucket, saveBucket and the model come from
-- common.lua and model.lua, prepended when loading.

local route, member = ARGV[1], ARGV[2]
local sent = ARGV[3] == '1'
local status = tonumber(ARGV[4])
local ubucket = ARGV[5]
local hasLimit = ARGV[6] == '1'
local h = {limit = tonumber(ARGV[7]), remaining = tonumber(ARGV[8]), resetAfter = tonumber(ARGV[9]),
  offset = tonumber(ARGV[12])}
local scope = ARGV[10]
local retry = tonumber(ARGV[11])
local cooldown = tonumber(ARGV[13])
local tokenAuth = ARGV[14] == '1'
local gkind, ghash = tonumber(ARGV[15]), ARGV[16]
local isGlobal = ARGV[17] == '1'
local bucketTTL, routeTTL = tonumber(ARGV[18]), tonumber(ARGV[19])
local majorDigest = ARGV[20]

local GB, TB = KEYS[5], KEYS[6]

local cf = redis.call('HMGET', KEYS[2], 'gpause', 'blocked', 'unauth')
local c = {pause = tonumber(cf[1]) or 0, blocked = tonumber(cf[2]) or 0, unauthorized = tonumber(cf[3]) or 0}
local credDirty = false

-- wakeOf returns in how many ms b may grant by the passing of time alone:
-- 0 for now, -1 when only a response can open it.
local function wakeOf(b)
  if available(b, now, c.blocked) then return 0 end
  local w = wakeAt(b, now, c.blocked)
  if w > 0 then return ceil(w - now) end
  return -1
end

-- The bucket the permit was granted from (none without a permit).
local gb
if gkind >= 0 then gb = loadBucket(GB, gkind) end

local function unprobe()
  if gkind == 1 and gb.pending > 0 then
    if redis.call('HINCRBY', KEYS[7], majorDigest, -1) <= 0 then
      redis.call('HDEL', KEYS[7], majorDigest)
    end
  end
end

if not sent then
  -- Never sent: give back the slot.
  if gb == nil then return {1, -1} end
  if isGlobal and member ~= '' then redis.call('ZREM', KEYS[3], member) end
  unprobe()
  giveBack(gb)
  saveBucket(GB, gb, bucketTTL)
  return {1, wakeOf(gb)}
end

if isGlobal and member ~= '' then
  -- The request reached Discord by now: its global slot counts from no
  -- later than this.
  redis.call('ZADD', KEYS[3], 'XX', 'LT', now, member)
end
if gb then
  unprobe()
  settle(gb)
end

-- What the response teaches about the route.
local target = gb
local tkey = GB
if gkind ~= 0 or ubucket == '' or ghash ~= ubucket then
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
  redis.call('PEXPIRE', KEYS[1], routeTTL)
end

local probes = 0
if target and not target.known then
  probes = tonumber(redis.call('HGET', KEYS[7], majorDigest)) or 0
end
local hp = nil
if hasLimit then hp = h end
if status == 429 then
  if credLimited(c, now, scope, retry) then
    credDirty = true
  elseif scope == 'shared' then
    if target then shared(target, now, retry) end
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
  local cd = cooldownOf(status, tokenAuth)
  if cd == 2 then
    redis.call('SET', KEYS[4], 1, 'PX', math.max(1, ceil(cooldown)))
  elseif cd == 1 then
    c.unauthorized, credDirty = now + cooldown, true
  end
end

if credDirty then
  redis.call('HSET', KEYS[2], 'gpause', c.pause, 'blocked', c.blocked, 'unauth', c.unauthorized)
  local last = math.max(c.pause, c.blocked, c.unauthorized)
  extend(KEYS[2], ceil(last - now) + 1000)
end

if gb and tkey ~= GB then saveBucket(GB, gb, bucketTTL) end
if target then
  local wake = wakeOf(target)
  saveBucket(tkey, target, bucketTTL)
  return {1, wake}
end
return {1, -1}
