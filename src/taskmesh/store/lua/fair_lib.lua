-- fair_lib: fair shares between the keys of a queue, counted in running slots: deficit round robin
-- (prepended after limits_lib to fair_push, limits_admit, limits_release and delayed_move). The ids of a
-- queue with fair shares wait under their fairness key; the ready set holds only about one fetch's worth
-- of them, which the fetchers pop to learn how many may start. The admission then puts those back and
-- starts as many, each from the key with the fewest running slots for its weight (its best id: priority,
-- then age). A started id holds its key's slot from its admission until its run ends, as a concurrency
-- slot does, so a key whose tasks run long holds many slots and is served less: keys share the
-- executors, not the starts. A key alone is served whenever an executor is free (nothing is held back
-- for keys that have no work), and a key arriving behind another's backlog holds no slot: its first id
-- starts at the next admission.
--   parked:@<key>   zset id -> its ready score: the key's ids waiting, best first
--   slots:@<key>    zset id -> lease end (ms): the key's runs
--   fair:keys       zset key -> its place: its slots * 100 / its weight, times 2^24, plus its last turn,
--                   over the keys with ids waiting
--   fair:state      hash: 'b' -> how many ids the ready set is fed to (a fetcher's batch, written by the
--                   admission), 's' -> the last turn given, 'f' -> the last id fed (its ready score)
-- Fair args: default weight (0: the queue has no fair shares), a count, then value, weight pairs.

local FAIR_SCALE = 100    -- a key's running slots per weight, in hundredths
local FAIR_TURNS = 16777216  -- 2^24: a key's last turn is the low part of its place (2^28 * 2^24 < 2^53)
local FAIR_LOAD_MAX = 268435455
local FAIR_BATCH = 1      -- the ready set's size before a fetcher said its batch (its first pop sets it)

local function read_fair(argv, at)
  local default = tonumber(argv[at])
  if default == nil or default <= 0 then
    return nil, at + 1
  end
  local n = tonumber(argv[at + 1])
  local weights = {}
  at = at + 2
  for _ = 1, n do
    weights[argv[at]] = tonumber(argv[at + 1])
    at = at + 2
  end
  return {default = default, weights = weights}, at
end

-- The fairness key among an id's limit keys ('' when it has none: those ids share one key).
local function fair_key(raw)
  if raw then
    for lk in string.gmatch(raw, '[^\n]+') do
      if string.sub(lk, 1, 1) == '@' then
        return string.sub(lk, 2)
      end
    end
  end
  return ''
end

-- A key's place in the turns: its running slots per weight first, then, between keys that hold as many,
-- the one served longest ago (a key that came back waits behind those already waiting). `served`: the
-- key was just served.
local function fair_rank(base, fkeys, state, fair, fk, now, served)
  local slots = base .. 'slots:@' .. fk
  redis.call('ZREMRANGEBYSCORE', slots, '-inf', ms(now))  -- lost runs' slots lapse with their leases
  if redis.call('EXISTS', base .. 'parked:@' .. fk) == 0 then
    redis.call('ZREM', fkeys, fk)
    return
  end
  local load = math.floor(redis.call('ZCARD', slots) * FAIR_SCALE / (fair.weights[fk] or fair.default))
  local old = redis.call('ZSCORE', fkeys, fk)
  local turn
  if served or not old then
    turn = redis.call('HINCRBY', state, 's', 1)
    if turn >= FAIR_TURNS then  -- every key's last turn forgotten, once in FAIR_TURNS
      redis.call('HSET', state, 's', 0)
      turn = 0
      local all = redis.call('ZRANGE', fkeys, 0, -1, 'WITHSCORES')
      for i = 1, #all, 2 do
        redis.call('ZADD', fkeys, ms(tonumber(all[i + 1]) - tonumber(all[i + 1]) % FAIR_TURNS), all[i])
      end
    end
  else
    turn = tonumber(old) % FAIR_TURNS
  end
  redis.call('ZADD', fkeys, ms(math.min(load, FAIR_LOAD_MAX) * FAIR_TURNS + turn), fk)
end

-- An id of `fk` to dispatch in its turn: `score` is its ready score (priority, then age).
local function fair_park(base, fkeys, state, fair, fk, id, score, now)
  redis.call('ZADD', base .. 'parked:@' .. fk, 'NX', score, id)
  if not redis.call('ZSCORE', fkeys, fk) then
    fair_rank(base, fkeys, state, fair, fk, now, false)
  end
end

-- Keep the ready set at its size with waiting ids, taken in turns from the keys next in turn (one id of
-- each, then again): the admission chooses what starts among the ids waiting, and an id in the ready set
-- is not among them until popped, so the ready set holds the keys' next ids in the order they are due,
-- not a block of one key's. Returns how many ids were moved there.
local function fair_feed(base, ready, fkeys, state, fair, now, step)
  local room = tonumber(redis.call('HGET', state, 'b') or FAIR_BATCH) - redis.call('ZCARD', ready)
  if room <= 0 then
    return 0
  end
  local keys = redis.call('ZRANGE', fkeys, 0, room - 1)
  local turn = redis.call('HINCRBY', state, 'f', room) - room  -- scored in the order fed, within a priority
  local fed = 0
  local touched = {}
  while room > 0 and #keys > 0 do
    local again = {}
    for _, fk in ipairs(keys) do
      if room <= 0 then
        break
      end
      local top = redis.call('ZPOPMIN', base .. 'parked:@' .. fk)
      if top[1] then
        fed = fed + 1
        room = room - 1
        local band = math.floor(tonumber(top[2]) / step) * step
        redis.call('ZADD', ready, 'NX', ms(band + turn + fed), top[1])
        again[#again + 1] = fk
      end
      touched[fk] = true
    end
    keys = again
  end
  for fk in pairs(touched) do
    fair_rank(base, fkeys, state, fair, fk, now, false)
  end
  return fed
end

-- The next id to start: the best waiting id of the key with the fewest running slots for its weight, and
-- its key; nil when none waits.
local function fair_next(base, fkeys, fair, now)
  while true do
    local head = redis.call('ZRANGE', fkeys, 0, 0)
    if not head[1] then
      return nil, nil, nil
    end
    local fk = head[1]
    local top = redis.call('ZPOPMIN', base .. 'parked:@' .. fk)
    if top[1] then
      return top[1], top[2], fk
    end
    redis.call('ZREM', fkeys, fk)
  end
end
