-- forget: delete KEYS[1]'s record and KEYS[2], its steps (an operator's step). ARGV[1] = '1' to
-- delete a pending claim too; a kept claim keeps its steps, its work may still need them.
-- Returns 0: nothing held the key; 1: a done record deleted; 2: a pending claim deleted;
-- 3: a pending claim kept.
local held = redis.call('GET', KEYS[1])
if not held then
  redis.call('DEL', KEYS[2])
  return 0
end
local pending = #held == 49 and string.byte(held, 1) == 80
if pending and ARGV[1] ~= '1' then
  return 3
end
redis.call('DEL', KEYS[1], KEYS[2])
if pending then
  return 2
end
return 1
