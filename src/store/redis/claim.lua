-- claim: hold KEYS[1] pending unless a live record holds it.
-- ARGV[1] = the pending value ('P' .. fingerprint(32) .. token(16)), ARGV[2] = lease in ms.
-- Returns 1 when the key was free and is now pending under the caller's token, else the stored
-- value unchanged (the client parses it and refuses anything it does not recognise).
local held = redis.call('GET', KEYS[1])
if held then
  return held
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.error_reply('ERR tower-idempotency: SET NX refused on an absent key')
end
return 1
