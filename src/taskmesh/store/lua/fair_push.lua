-- fair_push: ids of a queue with fair shares, ready now, wait under their fairness key, and the ready set
-- is fed to its size (after limits_lib and fair_lib).
-- KEYS[1] ready zset, KEYS[2] fair state hash, KEYS[3] fair keys zset, KEYS[4] the queue's limit keys hash
-- ARGV[1] now, ms since the ready scores' epoch, ARGV[2] priority step, ARGV[3] the queue's limit key
-- base, then the fair args (fair_lib), then triples: task id, priority, its limit keys (one per line)
-- Returns how many ids were added (one already ready or waiting keeps its place).
local now_rel = tonumber(ARGV[1])
local step = tonumber(ARGV[2])
local base = ARGV[3]
local fair, at = read_fair(ARGV, 4)
local now = redis_now()
local added = 0
for i = at, #ARGV, 3 do
  local id, priority, raw = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if raw ~= '' then
    redis.call('HSET', KEYS[4], id, raw)
  end
  if not redis.call('ZSCORE', KEYS[1], id) then
    fair_park(base, KEYS[3], KEYS[2], fair, fair_key(raw), id, ms((1000 - priority) * step + now_rel), now)
    added = added + 1
  end
end
fair_feed(base, KEYS[1], KEYS[3], KEYS[2], fair, now, step)
return added
