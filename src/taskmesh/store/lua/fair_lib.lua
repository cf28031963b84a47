-- fair_lib: fair shares between the keys of a queue (prepended to fair_push and delayed_move). An id
-- of a queue with fair shares is scored when it enters the ready set, start-time fair queuing: after
-- its key's last id and no earlier than the queue's virtual time, by one unit divided by its key's
-- weight. Keys with ids waiting are then popped in turn, each in proportion to its weight; a key
-- arriving behind another's backlog is scored at the head, so its first id goes in the next pop.
-- Per priority, the virtual time is the head's score (the oldest ready id), and when no id of that
-- priority is ready, the last score given (nobody waits, nobody owes).
--   clock hash: 'v' .. priority -> virtual time, 'm' .. priority -> the last score given (ms-like)
--   last zset: fairness key -> the score of its last id
-- Fair args: default weight (0: the queue has no fair shares), a count, then value, weight pairs.

local FAIR_UNIT = 1.0

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

local function fair_key(raw)
  if not raw then
    return nil
  end
  for lk in string.gmatch(raw, '[^\n]+') do
    if string.sub(lk, 1, 1) == '@' then
      return string.sub(lk, 2)
    end
  end
  return nil
end

local function fair_score(ready, clock, last, fair, fk, priority, now_rel, step)
  local band = (1000 - priority) * step
  local head = redis.call('ZRANGEBYSCORE', ready, string.format('%.3f', band),
                          '(' .. string.format('%.3f', band + step), 'WITHSCORES', 'LIMIT', 0, 1)
  local v = tonumber(redis.call('HGET', clock, 'v' .. priority) or '0')
  if head[2] then
    local h = tonumber(head[2]) - band
    if h > v then
      v = h
    end
  else
    -- idle at this priority: start from the last score given (or now, the first time)
    local m = tonumber(redis.call('HGET', clock, 'm' .. priority) or '0')
    if m > v then
      v = m
    end
    if v == 0 then
      v = now_rel
    end
    redis.call('ZREMRANGEBYSCORE', last, '-inf', '(' .. string.format('%.3f', v))
  end
  local t = tonumber(redis.call('ZSCORE', last, fk) or '0')
  if t < v then
    t = v
  end
  t = t + FAIR_UNIT / (fair.weights[fk] or fair.default)
  redis.call('ZADD', last, string.format('%.3f', t), fk)
  redis.call('HSET', clock, 'v' .. priority, string.format('%.3f', v))
  if t > tonumber(redis.call('HGET', clock, 'm' .. priority) or '0') then
    redis.call('HSET', clock, 'm' .. priority, string.format('%.3f', t))
  end
  return band + t
end

