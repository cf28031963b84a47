-- limits_admit: decide which popped ids may start now (after limits_lib and fair_lib). An id without limit
-- keys starts; one whose every key has room takes a slot (and a rate's interval) of each and starts;
-- any other is parked under the first key without room, and that key is looked at again when
-- it could have room (wake). While the queue's marker is missing (Redis lost its keys and the
-- reconciler has not rebuilt the slots yet) no limited id starts.
-- In a queue with fair shares the popped ids only say how many may start: they wait under their fairness
-- keys again, and as many are taken in the keys' turns (fair_lib), each then admitted as above; one that
-- starts holds its fairness key's slot. The ready set is then fed again to the fetcher's batch.
-- KEYS[1] ready zset, KEYS[2] tasks hash, KEYS[3] wake zset, KEYS[4] the queue's marker, KEYS[5] its fair
-- state hash, KEYS[6] its fair keys zset
-- Outside fair shares, an id whose one limit key is a concurrency without a rate, full and not backing
-- off, may be claimed ahead instead of parked ("standby", limits/standby.py), while the fetcher may
-- claim ahead (its prefetch) and holds fewer of the key's than its slots times the fetcher's depth (its
-- prefetch over its executors: a key's tasks are claimed as far ahead of its runs as the queue's are of
-- its executors), and at least one.
-- ARGV[1] lease (ms), ARGV[2] the queue's limit key base, ARGV[3] the fetcher's batch, ARGV[4] the
-- priority step, ARGV[5] how many more ids the fetcher may claim ahead, ARGV[6] its depth (prefetch over
-- executors), ARGV[7] a count, then pairs: limit key, how many of its ids the fetcher holds
-- claimed ahead; then the limits (see limits_lib), then the fair args (fair_lib), then pairs: task id,
-- its ready score
-- Returns pairs: task id, '' (no limit) | its limit keys (started) | '!' .. the key it waits for |
-- '~' .. the key it is claimed ahead for; then the lease end (ms) the slots it took hold, the fence of
-- their release (limits/releaser.py)
local now = redis_now()
local lease = tonumber(ARGV[1])
local base = ARGV[2]
local batch = tonumber(ARGV[3])
local step = tonumber(ARGV[4])
local ahead = tonumber(ARGV[5])
local depth = tonumber(ARGV[6])
local standing = {}
local limits_at = 8
for _ = 1, tonumber(ARGV[7]) do
  standing[ARGV[limits_at]] = tonumber(ARGV[limits_at + 1])
  limits_at = limits_at + 2
end
local limits, fair_at = read_limits(ARGV, limits_at)
local fair, at = read_fair(ARGV, fair_at)
local lost = redis.call('EXISTS', KEYS[4]) == 0
local out = {}

-- Whether an id of `lks`, blocked by `blocked`, is claimed ahead (see above).
local function stands_by(id, lks, blocked)
  if ahead <= 0 or fair or lost or #lks ~= 1 then
    return false
  end
  local def = limit_of(limits, blocked)
  if def.c <= 0 or def.iv > 0 or (standing[blocked] or 0) >= math.max(1, math.ceil(def.c * depth)) then
    return false
  end
  if tonumber(redis.call('GET', base .. 'backoff:' .. blocked) or '0') > now then
    return false
  end
  if redis.call('ZSCORE', base .. 'slots:' .. blocked, id) then  -- its last run's slot not given back yet
    return false
  end
  standing[blocked] = (standing[blocked] or 0) + 1
  ahead = ahead - 1
  return true
end

-- How many more ids each key may start, as a key's first id of this call found it (each start takes one),
-- and, once none may, when to look at it again: looked up again only when the starts used it up.
local avail, wakes = {}, {}

-- The limit key of `lks` without room for `id` now, and when to look at it again; nil: all have room.
local function blocking(id, lks)
  for _, lk in ipairs(lks) do
    local def = limit_of(limits, lk)
    if def then
      local n, when = 0, now + 1000
      if not lost then
        n, when = avail[lk], wakes[lk]
        if n == nil or (n <= 0 and when == nil) then
          n, when = room(base, lk, def, now)
          avail[lk], wakes[lk] = n, when
        end
        local held = redis.call('ZSCORE', base .. 'slots:' .. lk, id)
        if n > 0 and held then  -- a slot its last run did not give back: it lapses with that lease
          n, when = 0, tonumber(held)
        end
      end
      if n <= 0 then
        return lk, when
      end
    end
  end
  return nil, nil
end

local read = {}  -- the limit keys of the ids popped, read once (false: none)

local function admit(id, score)
  local raw = read[id]
  if raw == nil then
    raw = redis.call('HGET', KEYS[2], id)
  end
  local verdict = ''
  if raw then
    local lks = split(raw)
    local blocked, wake_at = blocking(id, lks)
    if blocked and stands_by(id, lks, blocked) then
      verdict = '~' .. blocked
    elseif blocked then
      redis.call('ZADD', base .. 'parked:' .. blocked, score, id)
      redis.call('ZADD', KEYS[3], 'LT', ms(wake_at), blocked)
      verdict = '!' .. blocked
    else
      for _, lk in ipairs(lks) do
        local def = limit_of(limits, lk)
        if def then
          take(base, lk, def, id, now, lease)
          if avail[lk] then
            avail[lk] = avail[lk] - 1
          end
        elseif fair and string.sub(lk, 1, 1) == '@' then
          redis.call('ZADD', base .. 'slots:' .. lk, ms(now + lease), id)
          fair_rank(base, KEYS[6], KEYS[5], fair, string.sub(lk, 2), now, true)
        end
      end
      verdict = raw
    end
  end
  out[#out + 1] = id
  out[#out + 1] = verdict
end

if fair then
  local n = 0
  for i = at, #ARGV, 2 do
    read[ARGV[i]] = redis.call('HGET', KEYS[2], ARGV[i])
    local fk = fair_key(read[ARGV[i]])
    fair_park(base, KEYS[6], KEYS[5], fair, fk, ARGV[i], ARGV[i + 1], now)
    n = n + 1
  end
  for _ = 1, n do
    local id, score = fair_next(base, KEYS[6], fair, now)
    if not id then
      break
    end
    admit(id, score)
  end
  redis.call('HSET', KEYS[5], 'b', batch)
  fair_feed(base, KEYS[1], KEYS[6], KEYS[5], fair, now, step)
else
  for i = at, #ARGV, 2 do
    admit(ARGV[i], ARGV[i + 1])
  end
end
out[#out + 1] = ms(now + lease)  -- the lease end the slots taken hold: the fence of their release
return out
