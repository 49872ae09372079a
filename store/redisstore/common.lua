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

-- loadBucket returns the model state kept at key, and whether there was
-- any; a new bucket of kind (0 learned, 1 probe, 2 none) otherwise.
-- Permits pending past their timeout (a process that died before
-- reporting) no longer count.
local function loadBucket(key, kind)
  local v = redis.call('GET', key)
  local b
  if v then
    b = decode(v)
    if b.pending > 0 and b.pendingUntil <= now then b.pending = 0 end
  else
    b = newBucket()
  end
  if kind == 1 then b.probe = true elseif kind == 2 then b.unlimited = true end
  return b, v ~= false and v ~= nil
end

-- saveBucket keeps b at key until ttl after the last moment it matters:
-- its reset, its pause or its pending permits' timeout.
local function saveBucket(key, b, ttl)
  local last = math.max(b.resetAt, b.pause, b.pendingUntil)
  local keep = ttl
  if last > now then keep = keep + ceil(last - now) end
  redis.call('SET', key, encode(b), 'PX', keep)
end
