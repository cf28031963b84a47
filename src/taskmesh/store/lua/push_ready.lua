-- push_ready: add task ids to a queue's ready set with one score, keeping any already there.
-- One call for a whole bulk enqueue: the ids travel as one argument, so the client does not
-- encode two arguments per task (issue 15).
-- KEYS[1] the ready set
-- ARGV[1] the score (ready_score of the tasks' priority and the push time)
-- ARGV[2] the ids, separated by single spaces
-- Returns how many were added.
local args, added = {}, 0
for id in string.gmatch(ARGV[2], '[^ ]+') do
  args[#args + 1] = ARGV[1]
  args[#args + 1] = id
  if #args >= 2000 then  -- unpack() has a bound on its results
    added = added + redis.call('ZADD', KEYS[1], 'NX', unpack(args))
    args = {}
  end
end
if #args > 0 then
  added = added + redis.call('ZADD', KEYS[1], 'NX', unpack(args))
end
return added
