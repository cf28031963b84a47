-- lock_release: delete a singleton lock only if this holder still owns it.
-- KEYS[1] lock key
-- ARGV[1] holder token
-- Returns 1 when released, 0 when the lock had expired or belongs to another holder.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
