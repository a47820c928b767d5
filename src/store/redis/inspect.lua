-- inspect: KEYS[1]'s value and the milliseconds it has left, read only. Returns nil when
-- nothing holds the key, else { value, PTTL }.
local held = redis.call('GET', KEYS[1])
if not held then
  return nil
end
return { held, redis.call('PTTL', KEYS[1]) }
