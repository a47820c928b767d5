-- record_step: record step ARGV[1] of KEYS[1] (the key's steps hash) unless it is recorded.
-- ARGV[1] = step id(32), ARGV[2] = the value, ARGV[3] = retention in ms. Not fenced by a token:
-- the first record wins. Returns 1 when recorded (the hash then expires ARGV[3] ms from now),
-- else the value recorded first, unchanged.
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return 1
end
return redis.call('HGET', KEYS[1], ARGV[1])
