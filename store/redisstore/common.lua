-- Prepended to claim.lua and update.lua.
--
-- now is Redis's clock in milliseconds: one clock for every process, whatever
-- their hosts' clocks say.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000

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

