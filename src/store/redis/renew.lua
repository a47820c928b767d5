-- renew: extend the pending lease of KEYS[1] to ARGV[2] ms from now, only if the caller's token
-- holds it. ARGV[1] = token(16). Returns 1 when extended, 0 otherwise.
local held = redis.call('GET', KEYS[1])
if held and #held == 49 and string.byte(held, 1) == 80 and string.sub(held, 34, 49) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
