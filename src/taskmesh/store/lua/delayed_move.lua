-- delayed_move: move due task ids from a queue's delayed set to its ready set.
-- KEYS[1] delayed zset (score = due ms * 1024 + priority; see keys.py delayed_score)
-- KEYS[2] ready zset (score = (1000 - priority) * 2^43 + (due ms - epoch))
-- KEYS[3] legacy priority hash (task id -> priority), written before 0.2; read once, then deleted
-- ARGV[1] now, ms since the Unix epoch (the instance's clock, corrected to PostgreSQL's)
-- ARGV[2] most ids to move in one call
-- ARGV[3] epoch of ready scores, ms (keys.py EPOCH_MS)
-- ARGV[4] priority step (keys.py PRIORITY_STEP)
-- ARGV[5] priority slots of a delayed score (keys.py DELAYED_PRIORITY_SLOTS)
-- ARGV[6] legacy score bound (keys.py LEGACY_DELAYED_SCORE_MAX): a smaller score is a bare due ms
-- KEYS[4] the queue's limit wake zset, ARGV[7] its limit key base, ARGV[8..] the limits in force:
-- the limit keys whose time came (on Redis's clock, as every limit decision) move back what may
-- start now of their parked ids (after limits_lib, which this script is prepended with)
-- KEYS[5] the queue's limit keys hash, KEYS[6] its fair state, KEYS[7] its fair keys zset, then after
-- the limits the fair args (fair_lib, prepended too): in a queue with fair shares a due id waits under
-- its fairness key as fair_push has it wait, and the ready set is fed
-- Returns {the number of ids moved to ready, in how many ms the earliest limit key is to be looked at
-- again (-1: none waits)}. ZADD NX: a task already in ready keeps its place.
local now = tonumber(ARGV[1])
local limit = tonumber(ARGV[2])
local epoch = tonumber(ARGV[3])
local step = tonumber(ARGV[4])
local slots = tonumber(ARGV[5])
local legacy_max = tonumber(ARGV[6])
local limits, fair_at = read_limits(ARGV, 8)
local fair = read_fair(ARGV, fair_at)
-- numbers are formatted by hand: Lua's own conversion keeps 14 digits, a score has 16
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', string.format('%.0f', now * slots + slots - 1),
                      'WITHSCORES', 'LIMIT', 0, limit)
local moved = 0
for i = 1, #due, 2 do
  local id = due[i]
  local score = tonumber(due[i + 1])
  local due_ms, priority
  if score < legacy_max then
    due_ms = score
    priority = tonumber(redis.call('HGET', KEYS[3], id) or '0')
    redis.call('HDEL', KEYS[3], id)
  else
    priority = score % slots
    due_ms = (score - priority) / slots
  end
  if due_ms > now then
    -- a legacy entry not due yet: rewrite it in the current encoding
    redis.call('ZADD', KEYS[1], string.format('%.0f', due_ms * slots + priority), id)
  else
    local fifo = due_ms - epoch
    if fifo < 0 then fifo = 0 end
    local score = string.format('%.0f', (1000 - priority) * step + fifo)
    if not fair then
      redis.call('ZADD', KEYS[2], 'NX', score, id)
    elseif not redis.call('ZSCORE', KEYS[2], id) then
      fair_park(ARGV[7], KEYS[7], KEYS[6], fair, fair_key(redis.call('HGET', KEYS[5], id)), id, score, redis_now())
    end
    redis.call('ZREM', KEYS[1], id)
    moved = moved + 1
  end
end
local lnow = redis_now()
local woken = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', string.format('%.0f', lnow), 'LIMIT', 0, limit)
if #woken > 0 then
  for _, lk in ipairs(woken) do
    moved = moved + unpark(ARGV[7], KEYS[2], KEYS[4], lk, limits, lnow)
  end
end
if fair then
  fair_feed(ARGV[7], KEYS[2], KEYS[7], KEYS[6], fair, lnow, step)  -- moved counts what left the delayed set
end
local soonest = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
if soonest[2] == nil then
  return {moved, -1}
end
return {moved, math.max(0, math.ceil(tonumber(soonest[2]) - lnow))}
