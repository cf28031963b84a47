-- limits_admit: decide which popped ids may start now (after limits_lib). An id without limit keys
-- starts; one whose every key has room takes a slot (and a rate's interval) of each and starts;
-- any other is parked under the first key without room, and that key is looked at again when
-- it could have room (wake). While the queue's marker is missing (Redis lost its keys and the
-- reconciler has not rebuilt the slots yet) no limited id starts.
-- KEYS[1] ready zset, KEYS[2] tasks hash, KEYS[3] wake zset, KEYS[4] the queue's marker
-- ARGV[1] lease (ms), ARGV[2] the queue's limit key base, then the limits (see limits_lib), then
-- pairs: task id, its ready score
-- Returns pairs: task id, '' (no limit) | its limit keys (started) | '!' .. the key it waits for; then
-- the lease end (ms) the slots it took hold, the fence of their release (limits/releaser.py)
local now = redis_now()
local lease = tonumber(ARGV[1])
local base = ARGV[2]
local limits, at = read_limits(ARGV, 3)
local lost = redis.call('EXISTS', KEYS[4]) == 0
local out = {}
for i = at, #ARGV, 2 do
  local id, score = ARGV[i], ARGV[i + 1]
  local raw = redis.call('HGET', KEYS[2], id)
  local verdict = ''
  if raw then
    local lks = split(raw)
    local blocked, wake_at = nil, nil
    for _, lk in ipairs(lks) do
      local def = limit_of(limits, lk)
      if def then
        local n, when = 0, now + 1000
        if not lost then
          n, when = room(base, lk, def, now)
          local held = redis.call('ZSCORE', base .. 'slots:' .. lk, id)
          if n > 0 and held then  -- a slot its last run did not give back: it lapses with that lease
            n, when = 0, tonumber(held)
          end
        end
        if n <= 0 then
          blocked, wake_at = lk, when
          break
        end
      end
    end
    if blocked then
      redis.call('ZADD', base .. 'parked:' .. blocked, score, id)
      redis.call('ZADD', KEYS[3], 'LT', ms(wake_at), blocked)
      verdict = '!' .. blocked
    else
      for _, lk in ipairs(lks) do
        local def = limit_of(limits, lk)
        if def then
          take(base, lk, def, id, now, lease)
        end
      end
      verdict = raw
    end
  end
  out[#out + 1] = id
  out[#out + 1] = verdict
end
out[#out + 1] = ms(now + lease)  -- the lease end the slots taken hold: the fence of their release
return out
