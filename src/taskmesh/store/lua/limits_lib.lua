-- limits_lib: what the limit scripts share (prepended to limits_admit, limits_release and
-- delayed_move; Redis scripts cannot include one another). Every key of a queue's limits is
-- under its base `{prefix}:{queue}:lim:` (one cluster slot with the queue's ready set):
--   slots:<limit key>    zset task id -> lease end (ms): the runs holding the key's slots
--   parked:<limit key>   zset task id -> ready score: ids that may not start yet
--   gcra:<limit key>     the key's theoretical arrival time (ms), for its rate
--   backoff:<limit key>  until when (ms) the key waits, after a handler's RateLimited
-- and the queue's `tasks` hash (task id -> its limit keys, one per line), `wake` zset
-- (limit key -> when to look at its parked ids again, ms) and `inuse` hash (limit name -> slots held
-- over its keys: the metrics' count, kept with each slot taken, given back or lapsed).
-- Limits come as ARGV: a count, then per limit `name, concurrency (0: none), interval ms (0: no
-- rate), burst` (limits/book.py script_args).
-- Every decision is on Redis's clock (TIME), one clock for every instance: an instance's estimate of
-- PostgreSQL's clock may be tens of ms off another's, and a rate of 20/s spaces starts by 50 ms. The
-- slot ends the heartbeat and the reconciler write come from an instance's clock or PostgreSQL's lease
-- end: they count in seconds, where that difference does not matter.

local function redis_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + tonumber(t[2]) / 1000
end

local function read_limits(argv, at)
  local limits = {}
  local n = tonumber(argv[at])
  at = at + 1
  for _ = 1, n do
    limits[argv[at]] = {c = tonumber(argv[at + 1]), iv = tonumber(argv[at + 2]), burst = tonumber(argv[at + 3])}
    at = at + 4
  end
  return limits, at
end

local function limit_of(limits, lk)
  local colon = string.find(lk, ':', 1, true)
  if colon then
    return limits[string.sub(lk, 1, colon - 1)]
  end
  return limits[lk]
end

local function split(raw)
  local out = {}
  for lk in string.gmatch(raw, '[^\n]+') do
    out[#out + 1] = lk
  end
  return out
end

local function ms(x)
  return string.format('%.0f', x)
end

local function count_slots(base, lk, n)
  if n ~= 0 and string.sub(lk, 1, 1) ~= '@' then  -- a fairness key's slots are no limit's
    redis.call('HINCRBY', base .. 'inuse', string.match(lk, '^[^:]+'), n)
  end
end

-- A rate's theoretical arrival time (GCRA) as a start now sees it: the stored one while the key's starts
-- keep to their schedule (it lags now by less than one interval: a start that came a few ms late, as the
-- dispatch takes, does not push every later start back by as much), else now (after a quiet spell the
-- starts at once are `burst`, no more). Either way no 1-s window holds more than rate + burst starts.
local function arrival(base, lk, def, now)
  local tat = tonumber(redis.call('GET', base .. 'gcra:' .. lk) or '0')
  if tat <= now - def.iv then
    return now
  end
  return tat
end

-- How many tasks of `lk` may start now (math.huge: no bound) and, when none may, when to look again.
local function room(base, lk, def, now)
  local backoff = tonumber(redis.call('GET', base .. 'backoff:' .. lk) or '0')
  if backoff > now then
    return 0, backoff
  end
  local n = math.huge
  if def.c > 0 then
    local slots = base .. 'slots:' .. lk
    count_slots(base, lk, -redis.call('ZREMRANGEBYSCORE', slots, '-inf', ms(now)))  -- lost runs' slots lapse
    n = def.c - redis.call('ZCARD', slots)
    if n <= 0 then
      local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
      return 0, tonumber(first[2])
    end
  end
  if def.iv > 0 then
    local tat = arrival(base, lk, def, now)
    local allowed = math.floor((now + def.iv * def.burst - tat) / def.iv)
    if allowed <= 0 then
      return 0, tat - def.iv * def.burst + def.iv
    end
    if allowed < n then
      n = allowed
    end
  end
  return n, nil
end

-- One start of `id` under `lk`: a slot until `now + lease`, one emission interval of its rate.
local function take(base, lk, def, id, now, lease)
  if def.c > 0 then
    count_slots(base, lk, redis.call('ZADD', base .. 'slots:' .. lk, ms(now + lease), id))
  end
  if def.iv > 0 then
    local tat = arrival(base, lk, def, now) + def.iv
    -- kept one interval past its time: the schedule a late start keeps to (see arrival)
    redis.call('SET', base .. 'gcra:' .. lk, string.format('%.3f', tat), 'PX', math.ceil(tat - now + def.iv) + 1000)
  end
end

-- Move back to ready as many parked ids of `lk` as may start now (best score first), and say when
-- to look again at those left. A limit no longer in force holds nothing: all of them go back.
local function unpark(base, ready, wake, lk, limits, now)
  local parked = base .. 'parked:' .. lk
  local waiting = redis.call('ZCARD', parked)
  if waiting == 0 then
    redis.call('ZREM', wake, lk)
    return 0
  end
  local def = limit_of(limits, lk)
  local n, at = waiting, nil
  if def then
    n, at = room(base, lk, def, now)
  end
  if n > waiting then
    n = waiting
  end
  if n > 0 then
    local ids = redis.call('ZRANGE', parked, 0, n - 1, 'WITHSCORES')
    for i = 1, #ids, 2 do
      redis.call('ZADD', ready, 'NX', ids[i + 1], ids[i])
    end
    redis.call('ZREMRANGEBYRANK', parked, 0, n - 1)
  end
  if n == waiting then
    redis.call('ZREM', wake, lk)
    return n
  end
  if at == nil then
    -- those moved take the room: a rate's next start comes after theirs; a slot frees with a
    -- result (the release looks at once) or lapses with a lease (look at the earliest one's end)
    at = now + 1000
    if def.iv > 0 then
      local tat = arrival(base, lk, def, now)
      at = tat + n * def.iv - def.iv * def.burst + def.iv
    elseif def.c > 0 then
      local first = redis.call('ZRANGE', base .. 'slots:' .. lk, 0, 0, 'WITHSCORES')
      if first[2] then
        at = tonumber(first[2])
      end
    end
  end
  redis.call('ZADD', wake, ms(at), lk)
  return n
end

