-- rate_limit: one request against a GCRA bucket (the generic cell rate algorithm: a token bucket
-- kept as one number, the theoretical arrival time), on Redis's clock, so that every instance
-- shares one budget per key and class.
-- KEYS[1] the bucket ({prefix}:ratelimit:{class}:{key id})
-- ARGV[1] emission interval: microseconds between requests at the sustained rate (1e6 / rate)
-- ARGV[2] burst: requests allowed at once after a quiet period (>= 1)
-- ARGV[3] cost: how many requests (or tasks) this one counts for (1..burst)
-- Returns {allowed 1|0, remaining requests now, retry after (us), until the bucket is full again (us)}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
local new_tat = tat + interval * tonumber(ARGV[3] or 1)
local allow_at = new_tat - tolerance
if allow_at > now then
  return {0, 0, allow_at - now, tat - now}
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return {1, math.floor((now + tolerance - new_tat) / interval), 0, new_tat - now}
