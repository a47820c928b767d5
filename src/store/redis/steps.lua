-- steps: every step of KEYS[1] (the key's steps hash) as field, value, field, value…, without
-- field 'r' (the steps' retention, kept for renew).
-- A script, not a bare HGETALL, so that clients route it to the primary and never answer it
-- from a replica or a client-side cache: a missed step would run its side effect again.
local all = redis.call('HGETALL', KEYS[1])
local steps = {}
for i = 1, #all, 2 do
  if all[i] ~= 'r' then
    steps[#steps + 1] = all[i]
    steps[#steps + 1] = all[i + 1]
  end
end
return steps
