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

-- extend makes key live at least ms longer, never shortening its TTL.
local function extend(key, ms)
  local cur = redis.call('PTTL', key)
  if cur == -2 then return end
  if cur < 0 or cur < ms then redis.call('PEXPIRE', key, ms) end
end

