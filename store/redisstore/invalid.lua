-- invalid: count invalid responses (401, 403, and 429 other than scope
-- shared) for a whole store, as Discord counts them for an IP address.
--
-- KEYS: 1 HASH  10-second slot index -> invalid responses in it
-- ARGV: 1 how many to add now (>= 0)   2 clock (ms, 0: Redis TIME)
-- Reply: {count in the window, ms until the oldest counted slot leaves it}
--
-- The key has a hash tag of its own: this is the only script that touches
-- it, on an invalid response or a periodic read, never on a claim.

-- now and ceil come from common.lua, prepended when loading.

local function invalidMain()
  local add = tonumber(ARGV[1])
  local cur = math.floor(now / INVALID_SLOT)
  if add > 0 then
    redis.call('HINCRBY', KEYS[1], cur, add)
    extend(KEYS[1], (INVALID_SLOTS + 2) * INVALID_SLOT)
  end
  local slots = redis.call('HGETALL', KEYS[1])
  local n, oldest = 0, cur + 1
  for i = 1, #slots, 2 do
    local idx, c = tonumber(slots[i]), tonumber(slots[i + 1])
    if idx == nil or c == nil or cur - idx > INVALID_SLOTS then
      redis.call('HDEL', KEYS[1], slots[i])
    else
      n = n + c
      if idx < oldest then oldest = idx end
    end
  end
  return {n, ceil((oldest + INVALID_SLOTS + 1) * INVALID_SLOT - now)}
end
