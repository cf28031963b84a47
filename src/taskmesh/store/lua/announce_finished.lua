-- announce_finished: publish the ids of tasks that just finished, only while someone waits for one.
-- KEYS[1] the waiters flag ({prefix}:finished:waiters), set with a TTL by each waiting request
-- ARGV[1] the channel ({prefix}:finished)
-- ARGV[2] the ids, space-separated
-- Returns 1 when it published, 0 when nobody waits (nothing is published then). Not PUBLISH's count
-- of receivers: on a Redis Cluster that counts only the subscribers of the node running the script.
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('PUBLISH', ARGV[1], ARGV[2])
  return 1
end
return 0
