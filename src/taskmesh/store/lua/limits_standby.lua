-- limits_standby: slots handed from runs that ended to tasks claimed ahead on the same instance, and
-- tasks claimed ahead that may start now (after limits_lib). A task is claimed ahead ("on standby") when
-- its one limit key, a concurrency without a rate, is full: it waits in its instance, not in Redis, and
-- takes the slot of the next run of its key that ends there, at once (the instance hands it over before
-- this script renames the slot: the count of the key's slots does not change). See limits/standby.py.
-- KEYS[1] ready zset, KEYS[2] wake zset
-- ARGV[1] lease (ms), ARGV[2] the queue's limit key base, then the limits (see limits_lib), then a count
-- and quadruples: limit key, the id whose run ended, its fence (ms; 0: none), the id it was handed to;
-- then a count and pairs: a standby id, its limit key (start it if its key has room now)
-- Returns {the lease end (ms) of the slots handed or taken, the count of standby ids that may start,
-- those ids, the count of keys backing off, then pairs: limit key, until when (ms), then the count of
-- keys looked at, then pairs: limit key, 1 when no slot of it may be handed over any more (its limit
-- was lowered below the slots held, or given a rate) else 0}
local now = redis_now()
local lease = tonumber(ARGV[1])
local base = ARGV[2]
local limits, at = read_limits(ARGV, 3)
local until_ms = ms(now + lease)
local backing = {}
local seen, seen_order = {}, {}
local function look(lk)
  if seen[lk] == nil then
    local def = limit_of(limits, lk)
    local stop = 0
    if def and (def.iv > 0 or def.c <= 0 or redis.call('ZCARD', base .. 'slots:' .. lk) > def.c) then
      stop = 1
    end
    seen[lk] = stop
    seen_order[#seen_order + 1] = lk
  end
end
local function backoff_of(lk)
  local b = tonumber(redis.call('GET', base .. 'backoff:' .. lk) or '0')
  if b > now then
    backing[lk] = b
    return true
  end
  return false
end
local n = tonumber(ARGV[at])
at = at + 1
for _ = 1, n do
  local lk, old, fence, new = ARGV[at], ARGV[at + 1], tonumber(ARGV[at + 2]), ARGV[at + 3]
  at = at + 4
  local slots = base .. 'slots:' .. lk
  local held = redis.call('ZSCORE', slots, old)
  if held and (fence == 0 or tonumber(held) == fence) then
    redis.call('ZREM', slots, old)
    redis.call('ZADD', slots, until_ms, new)
  else
    -- the ended run's slot had lapsed (its lease lost): the new run takes one of its own
    count_slots(base, lk, redis.call('ZADD', slots, until_ms, new))
  end
  backoff_of(lk)
  look(lk)
  -- a slot changed hands: one more of the key's waiting ids may be claimed ahead in its place
  local top = redis.call('ZPOPMIN', base .. 'parked:' .. lk)
  if top[1] then
    redis.call('ZADD', KEYS[1], 'NX', top[2], top[1])
    if redis.call('EXISTS', base .. 'parked:' .. lk) == 0 then
      redis.call('ZREM', KEYS[2], lk)
    end
  end
end
local started = {}
n = tonumber(ARGV[at])
at = at + 1
for _ = 1, n do
  local id, lk = ARGV[at], ARGV[at + 1]
  at = at + 2
  local def = limit_of(limits, lk)
  look(lk)
  if not def then  -- its limit is no longer in force: nothing holds it
    started[#started + 1] = id
  elseif not backoff_of(lk) and room(base, lk, def, now) > 0 then
    take(base, lk, def, id, now, lease)
    started[#started + 1] = id
  end
end
local out = {until_ms, #started}
for _, id in ipairs(started) do
  out[#out + 1] = id
end
local keys = {}
for lk, b in pairs(backing) do
  keys[#keys + 1] = lk
  keys[#keys + 1] = ms(b)
end
out[#out + 1] = #keys / 2
for _, v in ipairs(keys) do
  out[#out + 1] = v
end
out[#out + 1] = #seen_order
for _, lk in ipairs(seen_order) do
  out[#out + 1] = lk
  out[#out + 1] = seen[lk]
end
return out
