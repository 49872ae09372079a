-- estimate.lua: how long a claim would wait now, read-only (joined after
-- model.lua and common.lua). It takes no slot and writes nothing.
--
-- KEYS: 1 routes, 2 cred, 3 global, 4 dead (this major's cooldown),
--       5 bucket of the guessed hash (or the probe bucket), 6 probe bucket,
--       7 tickets of the guessed bucket, 8 the sublimit of the claim's kind
-- ARGV: 1 route, 2 guess ('' unknown, '\0' none), 3 global (0/1),
--       4 global limit, 5 global window (ms), 6 hold (ms), 7 token auth (0/1),
--       8 queued in this process ahead of the claim, 9 spacing (ms),
--       10 the claim's kind ('' none), last: clock
-- Reply: {1, wait ms} | {2, refusal ms, 2 unauthorized | 3 webhook gone}
--        | {3, the route's hash}: call again with its keys
local route, guess = ARGV[1], ARGV[2]
local isGlobal, glimit, gwindow, hold = ARGV[3] == '1', tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local tokenAuth, queued, spacing = ARGV[7] == '1', tonumber(ARGV[8]), tonumber(ARGV[9])
local sub = ARGV[10]

local c = loadCred(KEYS[2])
local refused = refusal(c, tokenAuth, KEYS[4])
if refused then return refused end

local r = routeHash(KEYS[1], route)
if r ~= guess then return {3, r} end

local at = now
if isGlobal then
  at = math.max(at, c.pause)
  local cnt = redis.call('ZCOUNT', KEYS[3], now - gwindow, '+inf')
  if cnt >= glimit then
    -- The window is full: a slot opens gwindow after the entry glimit
    -- places from the end, and one window later for each glimit claims
    -- queued ahead.
    local e = redis.call('ZRANGE', KEYS[3], cnt - glimit, cnt - glimit, 'WITHSCORES')
    local score = tonumber(e[2]) or now
    at = math.max(at, score - hold + gwindow + math.floor(queued / glimit) * gwindow)
  end
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
if kind == 0 then ahead = ahead + redis.call('ZCARD', KEYS[7]) end
at = math.max(at, bound(b, now, ahead))
if sub ~= '' then
  local untilT = tonumber(redis.call('HGET', KEYS[8], 'until')) or 0
  at = math.max(at, untilT)
end
return {1, ceil(at - now)}
