-- release: delete KEYS[1], only if the caller's token holds it pending.
-- ARGV[1] = token(16). Returns 1 when deleted, 0 otherwise.
local held = redis.call('GET', KEYS[1])
if held and #held == 49 and string.byte(held, 1) == 80 and string.sub(held, 34, 49) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
