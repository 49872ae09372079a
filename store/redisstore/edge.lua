-- edge: the Cloudflare blocks of a whole store (see store/internal/edge),
-- shared by its processes. One hash holds them: field = the gate's key (a
-- route, or '*' for every route), value = "until|probe until|strikes|probe
-- id|paced route", times in ms on the script's clock. The paced route of a
-- gate of every route is the route that met the block, whose pace the
-- processes learn (see edge.State.Paced): a process that reads the gates,
-- having missed the note of the block (it subscribed, or subscribed again,
-- after it), paces that route, not every route.
--
-- KEYS: 1 HASH of the gates
-- ARGV: 1 op: block, probe, pass, release or read; then by op:
--   block:   2 key  3 strike (0/1)  4 pause (ms)  5 first pause  6 max pause
--            7 the route that met the block ('' none)
--   probe:   2 keys (one per line)  3 probe id  4 lease (ms)
--   pass:    2 keys  3 probe id
--   release: 2 keys  3 probe id  4 penalty (ms)
--   read:    nothing
--   last: clock (ms, 0: Redis TIME)
-- Reply: block: one state; probe: 1 when granted, else the states of the
-- gates that hold the keys; pass, release: 0; read: every state. A state is
-- {key, until in ms from now, probe lease left in ms, strikes, paced route}.
--
-- The hash tag is the store's own: only this script touches the key, and
-- only while a block lasts (or to read the gates when a process starts).

-- now, ceil and extend come from common.lua, prepended when loading.

local function edgeMain()
  local op = ARGV[1]
  local K = KEYS[1]

  local function load(key)
    local v = redis.call('HGET', K, key)
    if not v then return nil end
    -- (A value written before the paced route was kept has none.)
    local u, p, s, id, paced = string.match(v, '^(%-?%d+)|(%-?%d+)|(%d+)|([^|]*)|?(.*)$')
    if not u then return nil end
    return {untilAt = tonumber(u), probe = tonumber(p), strikes = tonumber(s), id = id, paced = paced}
  end

  local function save(key, g)
    redis.call('HSET', K, key, g.untilAt .. '|' .. g.probe .. '|' .. g.strikes .. '|' .. g.id .. '|' .. g.paced)
    -- A gate lasts until a probe passes; a store that stopped sending
    -- forgets it a day after its pause.
    extend(K, ceil(math.max(g.untilAt, g.probe) - now) + 86400000)
  end

  local function state(key, g)
    return {key, ceil(g.untilAt - now), ceil(g.probe - now), g.strikes, g.paced}
  end

  local function split(s)
    local out = {}
    for k in string.gmatch(s, '[^\n]+') do out[#out + 1] = k end
    return out
  end

  if op == 'block' then
    local key, strike, pause, first, maxp = ARGV[2], ARGV[3] == '1', tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
    local g = load(key)
    if not g and key ~= '*' then
      -- Blocks on two routes: the IP is what is blocked.
      local fields = redis.call('HKEYS', K)
      for _, f in ipairs(fields) do
        if f ~= '*' then
          key, g = '*', load('*')
          break
        end
      end
    end
    if not g then
      g, strike = {untilAt = 0, probe = 0, strikes = 0, id = '', paced = ''}, true
    end
    if g.paced == '' and key == '*' then g.paced = ARGV[7] end
    if strike then
      g.strikes = g.strikes + 1
      g.probe, g.id = 0, ''
    end
    local p = first -- after the first block and the first blocked probe (see edge.Gates.pause)
    for _ = 3, g.strikes do
      if p >= maxp then break end
      p = p * 2
    end
    p = math.max(math.min(p, maxp), pause)
    g.untilAt = math.max(g.untilAt, now + p)
    save(key, g)
    return state(key, g)
  elseif op == 'probe' then
    local keys, id, lease = split(ARGV[2]), ARGV[3], tonumber(ARGV[4])
    local held, gs = {}, {}
    for _, key in ipairs(keys) do
      local g = load(key)
      if g then
        gs[key] = g
        if now < g.untilAt or (now < g.probe and g.id ~= id) then
          held[#held + 1] = state(key, g)
        end
      end
    end
    if #held > 0 then return held end
    for key, g in pairs(gs) do
      g.probe, g.id = now + lease, id
      save(key, g)
    end
    return 1
  elseif op == 'pass' then
    for _, key in ipairs(split(ARGV[2])) do
      local g = load(key)
      if g and (g.id == ARGV[3] or g.id == '' and g.untilAt <= now) then
        redis.call('HDEL', K, key)
      end
    end
    return 0
  elseif op == 'release' then
    local penalty = tonumber(ARGV[4])
    for _, key in ipairs(split(ARGV[2])) do
      local g = load(key)
      if g and g.id == ARGV[3] then
        g.probe, g.id = 0, ''
        if penalty > 0 then g.untilAt = math.max(g.untilAt, now + penalty) end
        save(key, g)
      end
    end
    return 0
  end
  local out = {}
  local all = redis.call('HGETALL', K)
  for i = 1, #all, 2 do
    local g = load(all[i])
    if g then out[#out + 1] = state(all[i], g) end
  end
  return out
end
