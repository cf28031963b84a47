-- delayed_move: move due task ids from a queue's delayed set to its ready set.
-- KEYS[1] delayed zset (score = due time, ms)
-- KEYS[2] ready zset (score = (1000 - priority) * 2^43 + (due ms - epoch))
-- KEYS[3] priority hash (task id -> priority)
-- ARGV[1] now, ms since the Unix epoch
-- ARGV[2] most ids to move in one call
-- ARGV[3] epoch of ready scores, ms (keys.py _EPOCH_MS)
-- ARGV[4] priority step (keys.py _PRIORITY_STEP)
-- Returns the number of ids moved. ZADD NX: a task already in ready keeps its place.
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local epoch = tonumber(ARGV[3])
local step = tonumber(ARGV[4])
local moved = 0
for i = 1, #due, 2 do
  local id = due[i]
  local due_ms = tonumber(due[i + 1])
  local priority = tonumber(redis.call('HGET', KEYS[3], id) or '0')
  local fifo = due_ms - epoch
  if fifo < 0 then fifo = 0 end
  local score = (1000 - priority) * step + fifo
  redis.call('ZADD', KEYS[2], 'NX', string.format('%.0f', score), id)
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[3], id)
  moved = moved + 1
end
return moved
