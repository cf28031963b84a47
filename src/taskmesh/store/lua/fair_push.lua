-- fair_push: ids of a queue with fair shares, ready now, enter its ready set scored by fair_lib (after it).
-- KEYS[1] ready zset, KEYS[2] fair clock hash, KEYS[3] fair last zset, KEYS[4] the queue's limit keys hash
-- ARGV[1] now, ms since the ready scores' epoch, ARGV[2] priority step, then the fair args (fair_lib),
-- then triples: task id, priority, its limit keys (one per line; its fairness key among them)
-- Returns how many ids were added (one already ready keeps its place: NX).
local now_rel = tonumber(ARGV[1])
local step = tonumber(ARGV[2])
local fair, at = read_fair(ARGV, 3)
local added = 0
for i = at, #ARGV, 3 do
  local id, priority, raw = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  redis.call('HSET', KEYS[4], id, raw)
  if not redis.call('ZSCORE', KEYS[1], id) then
    local fk = fair_key(raw) or ''
    local score = fair_score(KEYS[1], KEYS[2], KEYS[3], fair, fk, priority, now_rel, step)
    redis.call('ZADD', KEYS[1], 'NX', string.format('%.3f', score), id)
    added = added + 1
  end
end
return added
