-- announce_finished: publish the ids of tasks that just finished, only while someone waits for one.
-- KEYS[1] the waiters flag ({prefix}:finished:waiters), set with a TTL by each waiting request
-- ARGV[1] the channel ({prefix}:finished)
-- ARGV[2] the ids, space-separated
-- Returns the receivers of the message, 0 when nobody waits (nothing is published then).
if redis.call('EXISTS', KEYS[1]) == 1 then
  return redis.call('PUBLISH', ARGV[1], ARGV[2])
end
return 0
