-- renew: extend the pending lease of KEYS[1] to ARGV[2] ms from now, only if the caller's token
-- holds it, and keep KEYS[2], its steps, at least their retention past the new lease end: a
-- crash's retry comes after it. ARGV[1] = token(16). Returns 1 when extended, 0 otherwise.
local held = redis.call('GET', KEYS[1])
if held and #held == 49 and string.byte(held, 1) == 80 and string.sub(held, 34, 49) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  -- Steps without field 'r' (recorded by an older version) are kept to the lease end.
  local until_ms = tonumber(ARGV[2]) + (tonumber(redis.call('HGET', KEYS[2], 'r') or '') or 0)
  local left = redis.call('PTTL', KEYS[2])
  if left ~= -2 and left < until_ms then
    redis.call('PEXPIRE', KEYS[2], until_ms)
  end
  return 1
end
return 0
