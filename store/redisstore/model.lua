-- The rate-limit model of store/internal/model (model.go and cred.go),
-- function by function, for the scripts. Times are Redis milliseconds; the
-- drain times (tauLo, tauHi) are microseconds. A change here without the
-- same change there fails the transition table and the differential test.
--
-- A bucket is a table with the fields of model.Bucket and two of the Redis
-- store's own: pendingUntil, when every permit still pending has timed
-- out, and lineUntil, until when processes may wait in the bucket's line
-- (no line is read before a process took a place in it).

local FIELDS = {'known', 'limit', 'remaining', 'resetAt', 'estimated', 'window', 'span', 'offset',
  'pending', 'pause', 'retired', 'unlimited', 'probe', 'sliding', 'evidence', 'instant', 'seenAt',
  'seenRemaining', 'level', 'levelAt', 'tauLo', 'tauHi', 'pendingUntil', 'hold', 'holdLimit', 'heldAt',
  'serverInstant', 'lineUntil', 'cap', 'capLimit', 'capAt', 'passed', 'carried', 'ended', 'endedInstant', 'aged',
  'arriveBy'}
local FLAGS = {known = true, estimated = true, retired = true, unlimited = true, probe = true, sliding = true,
  serverInstant = true}

local MAX_DURATION = 24 * 3600 * 1000
local SLIDING_GUARD = 20

local function clamp(d)
  if d < 0 then return 0 end
  if d > MAX_DURATION then return MAX_DURATION end
  return d
end

-- idiv is Go's integer division (truncated) for the non-negative operands
-- the model divides.
local function idiv(a, b)
  return math.floor(a / b)
end

-- ceilDiv is a/b rounded up, for b > 0.
local function ceilDiv(a, b)
  return math.ceil(a / b)
end

local function newBucket()
  return {known = false, limit = 0, remaining = 0, resetAt = 0, estimated = false, window = 0, span = 0, offset = 0,
    pending = 0, pause = 0, retired = false, unlimited = false, probe = false, sliding = false, evidence = 0,
    instant = 0, seenAt = 0, seenRemaining = 0, level = 0, levelAt = 0, tauLo = 0, tauHi = 0, pendingUntil = 0,
    hold = 0, holdLimit = 0, heldAt = 0, serverInstant = false, lineUntil = 0, cap = 0, capLimit = 0, capAt = 0,
    passed = 0, carried = 0, ended = 0, endedInstant = 0, aged = 0, arriveBy = 0}
end

local CAP_PROBE = 60000
local CAP_MEMORY = 600000
local TRUSTED_WINDOW = 1000 -- model.TrustedWindow

-- A bucket is kept as 37 little-endian doubles, in FIELDS order (the
-- format is spelled out: a library may not call the string library while
-- it loads): one
-- struct.pack, no table of the values on the way (the Lua of Redis is slow
-- at loops and tables). A value of another length (an older layout) reads
-- as a new bucket.
local BUCKET_FORMAT = '<ddddddddddddddddddddddddddddddddddddd'
local BUCKET_SIZE = 8 * 37

local function decode(v)
  if #v ~= BUCKET_SIZE then return newBucket() end
  local k, l, r, ra, e, w, sp, o, p, pa, ret, un, pr, sl, ev, ins, sa, sr, lv, la, tl, th, pu, ho, hl, ha, si, lu,
    cp, cl, ca, ps, cr, en, ei, ag, ab = struct.unpack(BUCKET_FORMAT, v)
  return {known = k == 1, limit = l, remaining = r, resetAt = ra, estimated = e == 1, window = w, span = sp, offset = o,
    pending = p, pause = pa, retired = ret == 1, unlimited = un == 1, probe = pr == 1, sliding = sl == 1, evidence = ev,
    instant = ins, seenAt = sa, seenRemaining = sr, level = lv, levelAt = la, tauLo = tl, tauHi = th, pendingUntil = pu,
    hold = ho, holdLimit = hl, heldAt = ha, serverInstant = si == 1, lineUntil = lu, cap = cp, capLimit = cl,
    capAt = ca, passed = ps, carried = cr, ended = en, endedInstant = ei, aged = ag, arriveBy = ab}
end

local function bit(x)
  if x then return 1 end
  return 0
end

local function encode(b)
  return struct.pack(BUCKET_FORMAT, bit(b.known), b.limit, b.remaining, b.resetAt, bit(b.estimated), b.window, b.span,
    b.offset, b.pending, b.pause, bit(b.retired), bit(b.unlimited), bit(b.probe), bit(b.sliding), b.evidence, b.instant,
    b.seenAt, b.seenRemaining, b.level, b.levelAt, b.tauLo, b.tauHi, b.pendingUntil, b.hold, b.holdLimit, b.heldAt,
    bit(b.serverInstant), b.lineUntil, b.cap, b.capLimit, b.capAt, b.passed, b.carried, b.ended, b.endedInstant,
    b.aged, b.arriveBy)
end

local function tau(b)
  if b.tauHi > 0 then return b.tauHi end
  return idiv(b.window * 1000, math.max(b.limit, 1))
end

local function levelNow(b, t)
  local ta = tau(b)
  if ta <= 0 or b.levelAt == 0 then return b.level end
  return math.max(0, b.level - ((t - b.levelAt) * 1000) / ta)
end

-- model.ReportSlack
local REPORT_SLACK = 250

-- model.Bucket.flying
local function flying(b) return b.pending - b.aged end

-- model.Bucket.age
local function age(b, t)
  local n = flying(b)
  if n <= 0 or b.arriveBy == 0 or t < b.arriveBy + REPORT_SLACK or b.unlimited then return end
  if b.known then
    if b.arriveBy >= b.levelAt then
      b.level = levelNow(b, b.arriveBy) + n
      b.levelAt = b.arriveBy
    else
      b.level = b.level + n
    end
  end
  b.aged = b.pending
end

local function dripFree(b, t)
  local ta = tau(b)
  return ta > 0 and levelNow(b, t) + flying(b) + (b.offset * 1000) / ta + 1 <= b.limit
end

-- dripAt returns when the model next has a slot by the drain alone, and
-- false when the requests in flight fill the bucket (then the time the
-- drain is complete).
local function dripAt(b)
  local ta = tau(b)
  local room = b.limit - 1 - (b.offset * 1000) / ta - flying(b)
  local ok = room >= 0
  local excess = b.level - room
  if not ok then excess = b.level end
  return b.levelAt + math.ceil((math.max(excess, 0) * ta) / 1000), ok
end

local function available(b, t)
  age(b, t)
  if t < b.pause or b.retired then return false end
  if b.unlimited then return true end
  if b.hold > 0 and (b.pending > 0 or t < b.heldAt + b.hold) then return false end
  if not b.known then return flying(b) == 0 end
  if not b.sliding and b.resetAt ~= 0 and t >= b.resetAt and (b.pending == 0 or not b.estimated) then
    -- model.Bucket.refillable, refill
    local n = b.limit
    if b.cap > 0 then
      if b.passed > b.cap then b.cap = math.min(b.passed, b.limit) end
      n = math.min(n, b.cap)
      if n < b.limit and t - b.capAt >= CAP_PROBE then
        n = n + 1
        b.capAt = t
      end
    end
    b.passed = 0
    b.remaining = n - b.pending
    b.carried, b.ended, b.endedInstant = b.pending, 0, 0
    if b.pending > 0 then
      b.ended = b.resetAt
      if b.serverInstant then b.endedInstant = b.instant end
    end
    b.resetAt = 0
  end
  return b.remaining > 0 or (b.sliding and dripFree(b, t))
end

-- model.Bucket.perWindow
local function perWindow(b)
  if b.cap > 0 then return math.max(math.min(b.limit, b.cap), 1) end
  return b.limit
end

local function wakeAt(b, t)
  age(b, t)
  local at = b.pause
  if at > t then return at end
  if b.hold > 0 and not b.unlimited then
    if b.pending > 0 then return 0 end
    if b.heldAt + b.hold > t then return b.heldAt + b.hold end
  end
  if not b.known and not b.unlimited and flying(b) > 0 and b.arriveBy > 0 then
    return b.arriveBy + REPORT_SLACK
  end
  if b.known and b.remaining <= 0 and b.sliding then
    local at, ok = dripAt(b)
    if ok then return math.max(at, t + 1) end
    if flying(b) > 0 and b.arriveBy > 0 then return b.arriveBy + REPORT_SLACK end
    return 0
  end
  if b.known and b.remaining <= 0 and b.resetAt > t
    and (b.pending == 0 or (not b.estimated and perWindow(b) > b.pending)) then
    return b.resetAt
  end
  return 0
end

local function takeN(b, t, n, reach)
  if n <= 0 then return end
  age(b, t)
  b.pending = b.pending + n
  b.arriveBy = math.max(b.arriveBy, t + math.max(reach, 0))
  if b.hold > 0 then b.heldAt = math.max(b.heldAt, t) end
  if not b.known or b.unlimited then return end
  b.remaining = b.remaining - n
  if b.resetAt == 0 then
    b.resetAt = t + b.window
    b.estimated = true
  end
end

local function take(b, t, reach) takeN(b, t, 1, reach) end

local function dripRoom(b, t, most)
  local ta = tau(b)
  if ta <= 0 then return 0 end
  local lvl = levelNow(b, t)
  local off = (b.offset * 1000) / ta
  local fl = flying(b)
  local function admits(j)
    return lvl + (fl + j) + off + 1 <= b.limit
  end
  local free = math.floor(b.limit - lvl - fl - off)
  local n = 0
  if free > 0 then n = math.min(free, most) end
  while n > 0 and not admits(n - 1) do n = n - 1 end
  while n < most and admits(n) do n = n + 1 end
  return n
end

-- room: how many slots b grants at t one after the other, at most most.
local function room(b, t, most)
  if most <= 0 or not available(b, t) then return 0 end
  if b.unlimited then return most end
  if b.hold > 0 or not b.known then return 1 end
  local n = math.max(b.remaining, 0)
  if b.sliding then n = math.max(n, dripRoom(b, t, most)) end
  return math.min(math.max(n, 1), most)
end

local function settle(b)
  if b.pending > 0 then b.pending = b.pending - 1 end
  if b.aged > 0 then b.aged = b.aged - 1 end
end

local function unanswered(b, t)
  settle(b)
  b.heldAt = math.max(b.heldAt, t)
  if not b.known or b.unlimited then return end
  b.level = levelNow(b, t) + 1
  b.levelAt = t
  if b.sliding or (not b.estimated and b.resetAt - b.offset > t) then return end
  b.resetAt = math.max(b.resetAt, t + b.offset + b.window)
end

local function giveBack(b, t)
  settle(b)
  if b.known and b.remaining < b.limit and (b.sliding or b.resetAt == 0 or t < b.resetAt) then
    b.remaining = b.remaining + 1
  end
end

local function watchSliding(b, t, h, limit, remaining)
  local decided, instant, server = t, t + h.resetAfter, false
  if h.reset > 0 and h.reset - h.resetAfter > 0 then
    decided, instant, server = h.reset - h.resetAfter, h.reset, true
  end
  local prev, prevSeen, prevRemaining, prevServer = b.instant, b.seenAt, b.seenRemaining, b.serverInstant
  b.instant, b.seenAt, b.seenRemaining, b.serverInstant = instant, t, remaining, server
  if prevSeen == 0 or server ~= prevServer or limit <= 0
    or decided >= prev - math.max(SLIDING_GUARD, idiv(b.window, 4)) then
    return
  end
  local k = prevRemaining - remaining
  if k == 0 then return end
  local d = instant - prev
  if k < 0 then k, d = -k, -d end
  local ta = idiv(b.window * 1000, math.max(limit, 1))
  if d * 1000 > k * math.max(idiv(ta, 2), 2000) then
    b.evidence = b.evidence + 1
    if b.evidence >= 2 then b.sliding = true end
  elseif d < 5 and d > -5 then
    b.evidence = 0
    b.sliding = false
    b.tauLo, b.tauHi = 0, 0
  end
end

-- older: whether headers of a known fixed window ending at reset date
-- from a window that ended before the one b counts, and whether from the
-- window that ended with requests in flight (model.Bucket.older).
local function older(b, h, reset)
  if not b.known or b.sliding or h.resetAfter < 0 then return false, false end
  local gap = math.max(idiv(b.window, 2), SLIDING_GUARD)
  local ended = false
  if b.ended ~= 0 then
    if h.reset > 0 and b.endedInstant > 0 then
      ended = h.reset < b.endedInstant + gap
    else
      ended = h.limit == b.limit and reset < b.ended + gap
    end
  end
  return ended or (h.reset > 0 and b.serverInstant and b.instant > 0 and h.reset < b.instant - gap), ended
end

-- windowOf: whether headers of a known fixed window ending at reset date
-- from a later window than b counts, or an earlier one; on Discord's clock
-- when h and the window counted (its X-RateLimit-Reset, 0 unknown) are.
local function windowOf(b, h, reset, counted)
  if not b.known or b.sliding or b.estimated or b.resetAt == 0 or h.resetAfter < 0 then
    return false, false
  end
  local gap = math.max(idiv(b.window, 2), SLIDING_GUARD)
  if h.reset > 0 and counted > 0 then return h.reset > counted + gap, h.reset < counted - gap end
  return reset > b.resetAt + gap, reset < b.resetAt - gap
end

-- model.Bucket.sameWindow
local function sameWindow(b, h, counted)
  return not b.sliding and h.reset > 0 and counted > 0 and h.resetAfter >= 0
    and h.reset - counted <= 2 and counted - h.reset <= 2
end

-- observe applies headers h = {limit, remaining, resetAfter, offset, reset}.
local function observe(b, t, h, probes)
  age(b, t)
  local limit, remaining = h.limit, h.remaining
  local after = h.resetAfter
  if after < 0 then after = math.max(b.window, 1000) end
  local reset = t + clamp(after) + clamp(h.offset)
  b.heldAt = math.max(b.heldAt, t)
  local old, ended = older(b, h, reset)
  if old then
    if ended and b.carried > 0 then
      b.carried = b.carried - 1
      if b.resetAt == 0 or b.estimated then b.remaining = b.remaining + 1 end
    end
    return
  end
  -- A higher limit during a 429's pause: a response from before the
  -- limit fell, read after the 429 (model.go).
  if b.known and limit > b.limit and t < b.pause then return end
  if b.hold > 0 and limit ~= b.holdLimit then b.hold, b.holdLimit = 0, 0 end
  if b.cap > 0 and limit ~= b.capLimit then b.cap, b.capLimit, b.capAt = 0, 0, 0 end
  if limit > 0 and remaining == limit - 1 and h.resetAfter > 0 and (b.span == 0 or h.resetAfter < b.span) then
    b.span = h.resetAfter
  end
  b.offset = clamp(h.offset)
  local counted = 0
  if b.serverInstant then counted = b.instant end
  if h.resetAfter >= 0 then
    watchSliding(b, t, h, limit, remaining)
  end
  if b.known and limit ~= b.limit then
    b.tauLo, b.tauHi = 0, 0
  end
  local used = limit - remaining
  if h.resetAfter >= 0 and limit > 0 then
    local ra = clamp(h.resetAfter) * 1000
    if used >= 1 then
      local lo = idiv(ra, used)
      if lo > b.tauLo then b.tauLo = lo end
    end
    if used >= 2 then
      local hi = ceilDiv(ra, used - 1)
      if b.tauHi == 0 or hi < b.tauHi then b.tauHi = hi end
    end
  end
  local reported = used
  if h.resetAfter >= 0 and b.tauLo > 0 then
    reported = math.max(reported - 1, (clamp(h.resetAfter) * 1000) / b.tauLo)
  end
  b.level = math.max(levelNow(b, t), reported)
  b.levelAt = t
  if not b.known then
    b.known = true
    b.limit = limit
    b.remaining = remaining
    if not b.probe then
      b.remaining = math.max(0, remaining - probes)
    else
      b.remaining = math.max(0, remaining - b.pending)
    end
    b.resetAt = reset
    b.window = reset - t
    b.passed = 1
    b.aged = 0
  else
    local later, earlier = windowOf(b, h, reset, counted)
    if limit > b.limit then b.remaining = b.remaining + limit - b.limit end
    if limit < b.limit or later then remaining = remaining - b.pending end
    b.limit = limit
    if later or (remaining < b.remaining and not earlier) then b.remaining = remaining end
    if later then
      b.passed = 0
      if b.cap > 0 then b.remaining = math.min(b.remaining, b.cap - (limit - h.remaining) - b.pending) end
    end
    b.passed = b.passed + 1
    local same = sameWindow(b, h, counted)
    if b.estimated or b.resetAt == 0 or (reset > b.resetAt and not same) then
      b.resetAt = reset
      b.estimated = false
    elseif same and reset < b.resetAt and b.resetAt - reset < math.max(idiv(b.window, 2), SLIDING_GUARD)
      and reset >= b.pause then
      -- the response with the shortest way down bounds the end closest (model.go)
      b.resetAt = reset
    end
    if reset - t > b.window then b.window = reset - t end
  end
end

-- model.Bucket.sameFixedWindow
local function sameFixedWindow(b, h, probes)
  return not b.sliding and probes == 0 and h.reset > 0 and b.serverInstant and b.seenRemaining > 0
    and h.reset - b.instant <= 2 and b.instant - h.reset <= 2
end

local function limited(b, t, retry, h, probes)
  local contradicted = b.known and not b.unlimited and not b.estimated and b.remaining >= 0 and t < b.resetAt
    and (h == nil or (h.limit == b.limit and (h.remaining > 0 or sameFixedWindow(b, h, probes)))) and t >= b.pause
  local since = math.min(math.max(t - b.heldAt, 0), b.window)
  local sliding, left = b.sliding, b.resetAt - t
  if h then
    observe(b, t, h, probes)
    b.passed = b.passed - 1
  end
  b.pause = math.max(b.pause, t + clamp(retry))
  b.heldAt = math.max(b.heldAt, t)
  if contradicted and clamp(retry) > 0 then
    if not sliding and 2 * clamp(retry) >= left
      and (b.passed >= 2 or (b.passed == 1 and clamp(retry) <= left + idiv(b.window, 4))) then
      b.cap, b.capLimit, b.capAt = b.passed, b.limit, t
    else
      b.hold = math.max(b.hold, clamp(clamp(retry) + since))
      b.holdLimit = b.limit
    end
  end
  b.sliding, b.evidence = false, 0
  if b.known then
    if b.hold == 0 or b.holdLimit ~= b.limit then b.remaining = 0 end
    if b.resetAt < b.pause then b.resetAt, b.estimated = b.pause, false end
  end
end

local function shared(b, t, retry)
  b.pause = math.max(b.pause, t + clamp(retry))
  b.heldAt = math.max(b.heldAt, t)
end

local function seed(b, hold)
  if hold <= 0 or b.unlimited or hold <= b.hold or (b.known and b.window > 0 and b.window - b.offset <= TRUSTED_WINDOW) then return end
  b.hold = clamp(hold)
  b.holdLimit = b.limit
end

local function bound(b, t, ahead)
  age(b, t)
  local at = math.max(t, b.pause)
  if b.hold > 0 and not b.unlimited then
    at = math.max(at, b.heldAt + b.hold * (1 + ahead))
  end
  if not b.known or b.limit <= 0 or b.remaining > ahead then return at end
  if b.sliding then
    local drip = dripAt(b)
    return math.max(at, drip)
  end
  if b.resetAt > t then
    local windows = idiv(ahead - math.max(b.remaining, 0), perWindow(b))
    at = math.max(at, b.resetAt + windows * b.span)
  end
  return at
end

-- idle reports whether b holds nothing worth keeping at t.
local function idle(b, t)
  if b.pending > 0 or t < b.pause or (b.hold > 0 and t < b.heldAt + b.hold)
    or (b.cap > 0 and t < b.capAt + CAP_MEMORY) then return false end
  return b.retired or not b.known or b.resetAt == 0 or t >= b.resetAt
end

-- A credential: {pause, unauthorized}.
local function credLimited(c, t, scope, retry)
  if scope == 'global' then
    c.pause = math.max(c.pause, t + clamp(retry))
  elseif scope == 'blocked' then
    -- Per IP, not per credential: the store's edge gates hold it.
  else
    return false
  end
  return true
end

-- uncounted: a shared 429 with its bucket's headers did not count in the
-- bucket (see model.Uncounted).
local function uncounted(status, scope, hasLimit)
  return status == 429 and scope == 'shared' and hasLimit
end

local function invalid(status, scope)
  return status == 401 or status == 403 or (status == 429 and scope ~= 'shared')
end

-- cooldownOf: 0 none, 1 the credential (401), 2 a token-authenticated major.
local function cooldownOf(status, tokenAuth, anonymous)
  if tokenAuth and (status == 401 or status == 404) then return 2 end
  if not tokenAuth and not anonymous and status == 401 then return 1 end
  return 0
end

local SUBLIMIT_MARGIN = 1000

-- hiddenSublimit: a user 429 of a request of a kind (a rename) whose
-- bucket still had room (remaining), or whose retry outlasts its bucket's
-- reset by more than SUBLIMIT_MARGIN, came from the kind's hidden sublimit.
local function hiddenSublimit(retry, resetAfter, offset, remaining)
  return remaining > 0 or (resetAfter >= 0 and clamp(retry) > clamp(resetAfter) + clamp(offset) + SUBLIMIT_MARGIN)
end

-- learnRoute: 0 same, 1 learned the named hash, 2 no bucket.
local function learnRoute(hash, none, bucket, status, hasLimit)
  if bucket ~= '' then
    if hash ~= bucket or none then return 1 end
  elseif status >= 200 and status < 300 and not hasLimit and hash == '' and not none then
    return 2
  end
  return 0
end

local INVALID_SLOT, INVALID_SLOTS = 10000, 60
