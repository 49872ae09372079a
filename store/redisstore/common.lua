-- The helpers every function of the library shares, after model.lua.
--
-- KEYS and ARGV are the keys and arguments of the call being run, and now
-- Redis's clock in whole milliseconds: one clock for every process,
-- whatever their hosts' clocks say. The last argument of every call may
-- name another clock (tests drive the functions with a fake one); 0 means
-- Redis TIME. begin sets them, and empties what a call keeps, at the start
-- of each call: Redis runs one call at a time.
local KEYS, ARGV, now

-- ceil rounds up, and negative values to 0.
local function ceil(x)
  if x < 0 then return 0 end
  return math.ceil(x)
end

-- extend makes key live at least ms longer, never shortening its TTL: GT
-- sets a TTL longer than the key's, NX one on a key without any (just
-- created).
local function extend(key, ms)
  if redis.call('PEXPIRE', key, ms, 'GT') == 1 then return end
  redis.call('PEXPIRE', key, ms, 'NX')
end

-- chunked calls cmd with the fixed arguments head and then args, at most
-- 1000 of args per call (Lua's stack bounds unpack), and returns the
-- replies of the calls joined.
local function chunked(cmd, head, args)
  local out = {}
  for i = 1, #args, 1000 do
    local call = {cmd}
    for _, h in ipairs(head) do call[#call + 1] = h end
    for j = i, math.min(i + 999, #args) do call[#call + 1] = args[j] end
    local r = redis.call(unpack(call))
    if type(r) == 'table' then
      for _, x in ipairs(r) do out[#out + 1] = x end
    end
  end
  return out
end

-- The buckets and the credential a script reads are read from Redis once and
-- written back once, at the end of the script (flush).
local buckets, bucketOrder
local credKey, credState, credDirty

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
      if b.pending > 0 and b.pendingUntil <= now then b.pending, b.aged = 0, 0 end
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

-- saveBucket has b kept at key, at the end of the script, until ttl after
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

-- loadCred returns the credential's deadlines kept at key: pause (a global
-- 429), unauthorized (a 401), the moments until which the TTLs of the
-- global window (gexp) and of the routes (rexp) were last set, so that a
-- TTL is set when its horizon moves rather than on every call, and until
-- when processes may wait in the global window's line (glu), and until
-- when a probe of the credential may be in flight (pru: a claim on a known
-- bucket reads the probes of its major only before then).
local function loadCred(key)
  if not credState then
    local f = redis.call('HMGET', key, 'gpause', 'unauth', 'gexp', 'rexp', 'glu', 'pru')
    credKey = key
    credState = {pause = tonumber(f[1]) or 0, unauthorized = tonumber(f[2]) or 0,
      gexp = tonumber(f[3]) or 0, rexp = tonumber(f[4]) or 0, glu = tonumber(f[5]) or 0,
      pru = tonumber(f[6]) or 0}
  end
  return credState
end

-- saveCred has the credential's deadlines written at the end of the script.
local function saveCred()
  credDirty = true
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

-- touchRoutes keeps the routes key (c the credential) for ttl after its
-- last use, renewing its TTL only once half of it has passed.
local function touchRoutes(routes, c, ttl)
  if c.rexp - now < ttl / 2 then
    redis.call('PEXPIRE', routes, ttl)
    c.rexp = now + ttl
    saveCred()
  end
end

-- GLOBAL_KEEP is how much longer than its latest entry's window the global
-- window's key is kept, so that its TTL is renewed about once a minute.
local GLOBAL_KEEP = 60000

-- touchGlobal keeps the global window (key, c the credential) until
-- horizon at least, renewing its TTL only when horizon passes the last one
-- set. The TTL is set after the entries are added: a key just created gets
-- one at once.
local function touchGlobal(key, c, horizon)
  if horizon + 1000 > c.gexp then
    c.gexp = horizon + GLOBAL_KEEP
    redis.call('PEXPIRE', key, ceil(c.gexp - now))
    saveCred()
  end
end

-- An entry of the global window whose request has not answered yet
-- scores its grant plus the hold plus UNANSWERED: the half millisecond
-- tells it from an answered entry, which scores whole milliseconds.
local UNANSWERED = 0.5

-- slotOf returns when the n-th grant from now (counting those that the
-- holders of the line ahead keep) can go by the global window key, which
-- holds cnt entries that count (limit per window ms, each request
-- reaching Discord within hold ms of its grant), and whether that time is
-- exact: the entry that bounds it is final, its request answered. (An
-- unanswered request past its hold has reached Discord unless it left
-- late, and then its response moves its entry later: a slot reserved by
-- its hold could open too early.) Otherwise it is a lower bound.
local function slotOf(key, cnt, limit, window, hold, n)
  local idx = cnt - limit + n
  if idx <= 0 then return now, true end
  local m = 0
  if idx > cnt then
    -- Bounded by grants not made yet: each goes a window after one that
    -- is made.
    m = math.ceil((idx - cnt) / limit)
    idx = idx - m * limit
    if idx <= 0 then return now + m * window, false end
  end
  local e = redis.call('ZRANGE', key, idx - 1, idx - 1, 'WITHSCORES')
  local s = tonumber(e[2]) or now
  if s <= now and m == 0 and s == math.floor(s) then return s + window, true end
  return math.max(now, s - hold + window + m * window), false
end

-- Lines. A line is the order in which processes wait for a counter (a
-- bucket, the global window): a sorted set of process ids by order key
-- (the moment the process took its place, less URGENT for a process whose
-- waiters are urgent, so that those come first), and a hash of each one's
-- ticket, "want|expiry|lane": how many slots it waits for, until when the
-- ticket holds, and whether it is urgent (1). A ticket that expired holds
-- nothing and is dropped when read. The hash's field "_h" is the moment
-- until which the TTLs of both keys were last set.
local URGENT = 2 ^ 40
local LINE_TTL = 600000

local lines

-- A line is read from its head: the first LINE_HEAD tickets, whose wants
-- a claim near the front sums exactly; a ticket further back counts as
-- many slots ahead as its rank times the average want of the head's
-- tickets. Only the first processes of a line are told their turns, so
-- that is all a call needs; and it bounds the work of a call however many
-- processes wait.
local LINE_HEAD = 16

local function newLine(L, D)
  local line = {L = L, D = D, ids = {}, want = {}, lane = {}, exp = {}, pos = {}, n = 0, sum = 0, rank = {}}
  lines[L] = line
  return line
end

-- lineLoad returns the line kept at keys L (order) and D (tickets), read
-- once per call: its head's valid tickets in order, their wants, lanes,
-- expiries and positions, how many tickets it holds (n), and the rank of
-- the tickets of process id beyond its head. Expired tickets of the head
-- are dropped.
local function lineLoad(L, D, id)
  local line = lines[L]
  if line then return line end
  line = newLine(L, D)
  local ids = redis.call('ZRANGE', L, 0, LINE_HEAD - 1)
  if #ids == 0 then return line end
  line.n = #ids
  if #ids == LINE_HEAD then line.n = redis.call('ZCARD', L) end
  local fields = {}
  for i, m in ipairs(ids) do fields[i] = m end
  fields[#ids + 1] = '_h'
  local data = redis.call('HMGET', D, unpack(fields))
  line.h = tonumber(data[#ids + 1]) or 0
  local gone = nil
  for i, m in ipairs(ids) do
    local v = data[i]
    local w, exp, lane = nil, nil, nil
    if v then w, exp, lane = string.match(v, '^(%d+)|(%d+)|(%d)$') end
    if w and tonumber(exp) > now then
      local j = #line.ids + 1
      w = tonumber(w)
      line.ids[j], line.want[j], line.lane[j], line.exp[j], line.pos[m] = m, w, lane == '1', tonumber(exp), j
      line.sum = line.sum + w
    else
      gone = gone or {}
      gone[#gone + 1] = m
    end
  end
  if gone then
    redis.call('ZREM', L, unpack(gone))
    redis.call('HDEL', D, unpack(gone))
    line.n = line.n - #gone
  end
  if id and line.n > #line.ids then
    for _, m in ipairs({id, id .. '!'}) do
      if not line.pos[m] then
        local r = redis.call('ZRANK', L, m)
        if r then line.rank[m] = r - (#ids - #line.ids) end
      end
    end
  end
  return line
end

-- lineEmpty returns the line kept at keys L and D, known to hold no
-- ticket (its counter says nobody waits), without reading it.
local function lineEmpty(L, D)
  return lines[L] or newLine(L, D)
end

-- average returns the average want of the head of line, rounded up to a
-- whole slot (1 when empty): slot counts index the global window.
local function average(line)
  if #line.ids == 0 then return 1 end
  return math.ceil(line.sum / #line.ids)
end

-- lineAhead returns how many slots the tickets of line ahead of ticket id
-- keep, where id stands or, when it holds no ticket, would stand (an
-- urgent ticket behind the urgent ones only), id's position in the head
-- (nil when none), and when the first of the head's tickets ahead of it
-- expires (nil when none): a holder that stopped running keeps its slots
-- until then.
local function lineAhead(line, id, urgent)
  local p = line.pos[id]
  local sum, soonest = 0, nil
  for j = 1, #line.ids do
    if j == p or urgent and not line.lane[j] then return sum, p, soonest end
    sum = sum + line.want[j]
    if not soonest or line.exp[j] < soonest then soonest = line.exp[j] end
  end
  -- Beyond the head: where id stands, or at the back.
  local r = line.rank[id]
  if not r then
    if urgent and #line.ids < line.n and not line.lane[#line.ids] then return sum, p, soonest end
    r = line.n
  end
  return sum + math.max(0, r - #line.ids) * average(line), p, soonest
end

-- lineTotal returns how many slots every ticket of line keeps.
local function lineTotal(line)
  return line.sum + math.max(0, line.n - #line.ids) * average(line)
end

-- lineExpire has the ticket of id, at position p of the head of line,
-- end at expiry.
local function lineExpire(line, id, p, expiry)
  line.exp[p] = expiry
  local lane = '0'
  if line.lane[p] then lane = '1' end
  redis.call('HSET', line.D, id, line.want[p] .. '|' .. math.floor(expiry) .. '|' .. lane)
end

-- lineRetime makes the ticket of id, a holder of line told its turn comes
-- later than it expected, hold until expiry at least.
local function lineRetime(line, id, expiry)
  local p = line.pos[id]
  if p and line.exp[p] < expiry then lineExpire(line, id, p, expiry) end
end

-- A process holds up to two tickets in a line: its id for its normal
-- waiters and its id and "!" for its urgent ones, which stand ahead of
-- every normal ticket. owner returns the process of a ticket.
local function owner(member)
  if string.sub(member, -1) == '!' then return string.sub(member, 1, -2) end
  return member
end

-- lineOthers reports whether a ticket of another process than id waits in
-- line.
local function lineOthers(line, id)
  local mine = 0
  if line.pos[id] or line.rank[id] then mine = mine + 1 end
  if line.pos[id .. '!'] or line.rank[id .. '!'] then mine = mine + 1 end
  return line.n > mine
end

-- ORDER_STEP is how far behind the last ticket of its lane a new place
-- goes when that ticket took its place in the same millisecond or later.
local ORDER_STEP = 1 / 256

-- lineJoin gives the ticket id (see owner) want slots until expiry, in
-- the urgent lane or not. A ticket keeps its place unless it goes to the
-- back (again: it was served in part). A new place is at now, and behind
-- every ticket of its lane, even one that took its place in the same
-- millisecond: a claim is told its wait as if it stood at the back
-- (lineAhead), and the line keeps that order. (Ordered by the millisecond
-- alone, two processes that joined in one were ordered by their ids: the
-- one told it came first could find itself second at its turn, and both
-- then waited a window more.) The order is written in full: Redis would
-- round a number to 14 digits, a tenth of a millisecond.
local function lineJoin(line, id, want, expiry, urgent, again)
  local p = line.pos[id] or line.rank[id]
  if not p or again then
    local order, top = now, '+inf'
    if urgent then order, top = now - URGENT, '(' .. string.format('%.0f', now - URGENT / 2) end
    local last = redis.call('ZREVRANGEBYSCORE', line.L, top, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
    if last[2] then order = math.max(order, tonumber(last[2]) + ORDER_STEP) end
    redis.call('ZADD', line.L, string.format('%.6f', order), id)
  end
  local lane = '0'
  if urgent then lane = '1' end
  redis.call('HSET', line.D, id, math.max(1, want) .. '|' .. math.floor(expiry) .. '|' .. lane)
  if not line.h then line.h = tonumber(redis.call('HGET', line.D, '_h')) or 0 end
  if expiry + 1000 > line.h then
    line.h = expiry + LINE_TTL
    redis.call('HSET', line.D, '_h', line.h)
    redis.call('PEXPIRE', line.L, ceil(line.h - now))
    redis.call('PEXPIRE', line.D, ceil(line.h - now))
  end
end

-- lineLeave takes id's ticket out of line.
local function lineLeave(line, id)
  if line.pos[id] or line.rank[id] then
    redis.call('ZREM', line.L, id)
    redis.call('HDEL', line.D, id)
  end
end

-- Pushes. A process that waits in a line for what only another process's
-- report can end (a response, a slot given back), or whose turn the
-- holders ahead of it moved, is told through its own channel, chan .. its
-- id: the message names the credential (tag), the line, and in how many
-- ms its turn comes (0: now), and, when a probe's response taught the
-- route's bucket, its hash, so that the waiters of the probe claim on it
-- at once. Each holder is told once per call.
local pushed

local function push(chan, tag, id, name, at, hash)
  local k = id .. '\0' .. name
  if pushed[k] then return end
  pushed[k] = true
  local msg = tag .. ' ' .. name .. ' ' .. math.max(0, math.ceil(at or 0))
  if hash and hash ~= '' and not string.find(hash, '%s') then msg = msg .. ' ' .. hash end
  redis.call('PUBLISH', chan .. id, msg)
end

-- pushHeads tells the processes of the first n tickets of line that are
-- not process except's, and stand before position upto if given, that
-- their turn may have come (and the route's hash, if given). Each told
-- ticket ends by claimBy at the latest: a holder that runs claims before
-- then, which renews its ticket; one that stopped running (SIGSTOP, a
-- long pause) keeps no slots past it, where the even shares of later
-- windows would have kept one for it as long as it slept.
local function pushHeads(chan, tag, line, name, n, except, upto, hash, claimBy)
  local told = 0
  for j, m in ipairs(line.ids) do
    if told >= n or (upto and j >= upto) then return end
    local id = owner(m)
    if id ~= except then
      push(chan, tag, id, name, 0, hash)
      local p = line.pos[m]
      if p and line.exp[p] > claimBy then lineExpire(line, m, p, claimBy) end
      told = told + 1
    end
  end
end

-- firstOther returns the first ticket of line that is not process
-- except's, or nil.
local function firstOther(line, except)
  for _, m in ipairs(line.ids) do
    if owner(m) ~= except then return m end
  end
  return nil
end

-- flush writes what the script changed.
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
    redis.call('HSET', credKey, 'gpause', c.pause, 'unauth', c.unauthorized, 'gexp', c.gexp, 'rexp', c.rexp, 'glu', c.glu,
      'pru', c.pru)
    extend(credKey, ceil(math.max(c.pause, c.unauthorized, c.gexp, c.rexp, c.glu, c.pru) - now) + 1000)
  end
end

-- begin starts a call of keys and args.
local function begin(keys, args)
  KEYS, ARGV = keys, args
  now = tonumber(args[#args]) or 0
  if now <= 0 then
    local t = redis.call('TIME')
    now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  buckets, bucketOrder = {}, {}
  credKey, credState, credDirty = nil, nil, false
  lines, pushed = {}, {}
end
