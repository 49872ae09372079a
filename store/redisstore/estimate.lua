-- estimate.lua: how long a claim would wait now (joined after model.lua
-- and common.lua). It takes no slot and no ticket.
--
-- KEYS: 1 routes, 2 cred, 3 global, 4 dead (this major's cooldown),
--       5 bucket of the guessed hash (or the probe bucket), 6 probe bucket,
--       7 the line of 5 and 8 its tickets, 9 the global window's line and
--       10 its tickets, 11 the sublimit of the claim's kind
-- ARGV: 1 route, 2 guess ('' unknown, '\0' none), 3 global (0/1),
--       4 global limit, 5 global window (ms), 6 hold (ms), 7 token auth (0/1),
--       8 queued in this process ahead of the claim, 9 spacing (ms),
--       10 the claim's kind ('' none), 11 this process's id, last: clock
-- Reply: {1, wait ms} | {2, refusal ms, 2 unauthorized | 3 webhook gone}
--        | {3, the route's hash}: call again with its keys
local function estimateMain()
  local route, guess = ARGV[1], ARGV[2]
  local isGlobal, glimit, gwindow, hold = ARGV[3] == '1', tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local tokenAuth, queued, spacing = ARGV[7] == '1', tonumber(ARGV[8]), tonumber(ARGV[9])
  local sub, me = ARGV[10], ARGV[11]

  local c = loadCred(KEYS[2])
  local refused = refusal(c, tokenAuth, KEYS[4])
  if refused then return refused end

  local r = routeHash(KEYS[1], route)
  if r ~= guess then return {3, r} end

  local at = now
  if isGlobal then
    at = math.max(at, c.pause)
    local cnt = redis.call('ZCOUNT', KEYS[3], '(' .. (now - gwindow), '+inf')
    local ahead = queued
    if c.glu > now then ahead = ahead + lineAhead(lineLoad(KEYS[9], KEYS[10]), me, false) end
    local slot = slotOf(KEYS[3], cnt, glimit, gwindow, hold, ahead + 1)
    at = math.max(at, slot)
  end

  local kind = 0
  if r == '' then kind = 1 elseif r == '\0' then kind = 2 end
  local b, found = loadBucket(KEYS[5], kind)
  if kind == 0 and not found then
    local pb = loadBucket(KEYS[6], 1)
    if pb.pending > 0 then b = pb end
  end
  seed(b, spacing)
  local ahead = queued
  if kind ~= 2 and b.lineUntil > now then ahead = ahead + lineAhead(lineLoad(KEYS[7], KEYS[8]), me, false) end
  at = math.max(at, bound(b, now, ahead))
  if sub ~= '' then
    local untilT = tonumber(redis.call('HGET', KEYS[11], 'until')) or 0
    at = math.max(at, untilT)
  end
  return {1, ceil(at - now)}
end
