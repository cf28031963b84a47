-- limits_release: runs that ended (or claims that failed) give their slots back, and each key they
-- freed moves back what may start now of its parked ids (after limits_lib).
-- In a queue with fair shares a fairness key's slot given back ranks its key again (fair_lib).
-- KEYS[1] ready zset, KEYS[2] tasks hash, KEYS[3] wake zset, KEYS[4] fair keys zset, KEYS[5] fair state
-- ARGV[1] the queue's limit key base, then the limits (see limits_lib), then the fair args (fair_lib), then
-- sextuples: task id, its limit keys (one per line), the keys to back off (one per line; a
-- handler's RateLimited), until when (ms; 0: no back-off), ended (1: forget its keys: the task is over),
-- fence (ms; 0: none): give a slot back only while it still holds this lease end, the last one this
-- instance gave it, so that a run whose result comes late (its lease lost, its task started again
-- elsewhere under the same id) never takes the new run's slot
-- Returns how many parked ids went back to ready.
local now = redis_now()
local base = ARGV[1]
local limits, fair_at = read_limits(ARGV, 2)
local fair, at = read_fair(ARGV, fair_at)
local freed, order = {}, {}
for i = at, #ARGV, 6 do
  local id, raw, slow, until_ms, ended = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3]), ARGV[i + 4]
  local fence = tonumber(ARGV[i + 5])
  if until_ms > now then
    for _, lk in ipairs(split(slow)) do
      local key = base .. 'backoff:' .. lk
      if tonumber(redis.call('GET', key) or '0') < until_ms then
        redis.call('SET', key, ms(until_ms), 'PX', math.ceil(until_ms - now) + 1000)
      end
    end
  end
  for _, lk in ipairs(split(raw)) do
    local slots = base .. 'slots:' .. lk
    if fence == 0 or tonumber(redis.call('ZSCORE', slots, id) or '-1') == fence then
      count_slots(base, lk, -redis.call('ZREM', slots, id))
    end
    if ended == '1' then  -- a task cancelled while parked
      redis.call('ZREM', base .. 'parked:' .. lk, id)
    end
    if not freed[lk] then
      freed[lk] = true
      order[#order + 1] = lk
    end
  end
  if ended == '1' then
    redis.call('HDEL', KEYS[2], id)
  end
end
local moved = 0
for _, lk in ipairs(order) do
  if string.sub(lk, 1, 1) ~= '@' then
    moved = moved + unpark(base, KEYS[1], KEYS[3], lk, limits, now)
  elseif fair then
    fair_rank(base, KEYS[4], KEYS[5], fair, string.sub(lk, 2), now, false)
  end
end
return moved
