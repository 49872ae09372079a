-- Prepended to claim.lua and update.lua, after model.lua.
--
-- now is Redis's clock in whole milliseconds: one clock for every process,
-- whatever their hosts' clocks say. The last argument of every script may
-- name another clock (tests drive the scripts with a fake one); 0 means
-- Redis TIME.
local now = tonumber(ARGV[#ARGV]) or 0
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- ceil rounds up, and negative values to 0.
local function ceil(x)
  if x < 0 then return 0 end
  return math.ceil(x)
end

-- extend makes key live at least ms longer, never shortening its TTL: GT
-- sets a TTL longer than the key's, NX one on a key without any (just
-- created). fresh tries NX first, for a key that is likely new.
local function extend(key, ms, fresh)
  if fresh then
    if redis.call('PEXPIRE', key, ms, 'NX') == 1 then return end
    redis.call('PEXPIRE', key, ms, 'GT')
    return
  end
  if redis.call('PEXPIRE', key, ms, 'GT') == 1 then return end
  redis.call('PEXPIRE', key, ms, 'NX')
end

-- The buckets and the credential a step reads are read from Redis once and
-- written back once, at the end of the step (flush).
local buckets, bucketOrder = {}, {}
local credKey, credState, credDirty = nil, nil, false

-- loadBucket returns the model state kept at key, and whether there was
-- any; a new bucket of kind (0 learned, 1 probe, 2 none) otherwise.
-- Permits pending past their timeout (a process that died before
-- reporting) no longer count.
local function loadBucket(key, kind)
  local e = buckets[key]
  if not e then
    local v = redis.call('GET', key)
    local b
    if v then
      b = decode(v)
      if b.pending > 0 and b.pendingUntil <= now then b.pending = 0 end
    else
      b = newBucket()
    end
    e = {b = b, found = v ~= false and v ~= nil}
    buckets[key] = e
    bucketOrder[#bucketOrder + 1] = key
  end
  if kind == 1 then e.b.probe = true elseif kind == 2 then e.b.unlimited = true end
  return e.b, e.found
end

-- saveBucket has b kept at key, at the end of the step, until ttl after
-- the last moment it matters: its reset, its pause or its pending permits'
-- timeout.
local function saveBucket(key, b, ttl)
  local e = buckets[key]
  if not e then
    e = {found = false}
    buckets[key] = e
    bucketOrder[#bucketOrder + 1] = key
  end
  e.b, e.ttl = b, ttl
end

-- loadCred returns the credential's deadlines kept at key.
local function loadCred(key)
  if not credState then
    local f = redis.call('HMGET', key, 'gpause', 'unauth')
    credKey = key
    credState = {pause = tonumber(f[1]) or 0, unauthorized = tonumber(f[2]) or 0}
  end
  return credState
end

-- refusal returns the reply that refuses a claim while a cooldown lasts,
-- or nil: {2, ms, 3} while the token-authenticated major's key dead lives
-- (a webhook that answered 401 or 404), {2, ms, 2} while the credential
-- c answered 401.
local function refusal(c, tokenAuth, dead)
  if tokenAuth then
    local ttl = redis.call('PTTL', dead)
    if ttl > 0 then return {2, ttl, 3} end
  elseif c.unauthorized > now then
    return {2, ceil(c.unauthorized - now), 2}
  end
  return nil
end

-- routeHash returns what the routes key holds for route: its bucket hash,
-- '\0' for a route without one, '' when unknown.
local function routeHash(routes, route)
  return redis.call('HGET', routes, route) or ''
end

-- saveCred has the credential's deadlines written at the end of the step.
local function saveCred()
  credDirty = true
end

-- flush writes what the step changed.
local function flush()
  for _, key in ipairs(bucketOrder) do
    local e = buckets[key]
    if e.ttl then
      local b = e.b
      local last = math.max(b.resetAt, b.pause, b.pendingUntil, b.heldAt + b.hold)
      local keep = e.ttl
      if last > now then keep = keep + ceil(last - now) end
      redis.call('SET', key, encode(b), 'PX', keep)
    end
  end
  if credDirty then
    local c = credState
    redis.call('HSET', credKey, 'gpause', c.pause, 'unauth', c.unauthorized)
    extend(credKey, ceil(math.max(c.pause, c.unauthorized) - now) + 1000)
  end
end
