-- lease_left: the milliseconds left on KEYS[1]'s pending claim, or -1 when nothing pending holds
-- it (absent, or a finished record).
local held = redis.call('GET', KEYS[1])
if held and #held == 49 and string.byte(held, 1) == 80 then
  return redis.call('PTTL', KEYS[1])
end
return -1
