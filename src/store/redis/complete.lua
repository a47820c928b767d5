-- complete: store KEYS[1] done, if the caller's token holds it pending or nothing holds it, and
-- delete KEYS[2], its steps: the record answers every repeat from now on.
-- ARGV[1] = token(16), ARGV[2] = the done value ('D' .. fingerprint(32) .. record), ARGV[3] = retention in ms.
-- Returns 1 when written, 0 when another claimant (or a finished record) holds the key; its
-- steps are then left to it.
local held = redis.call('GET', KEYS[1])
if held and not (#held == 49 and string.byte(held, 1) == 80 and string.sub(held, 34, 49) == ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
redis.call('DEL', KEYS[2])
return 1
