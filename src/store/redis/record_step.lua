-- record_step: record step ARGV[1] of KEYS[1] (the key's steps hash) unless it is recorded.
-- KEYS[2] = the key's record. ARGV[1] = step id(32), ARGV[2] = the value, ARGV[3] = retention
-- in ms. Not fenced by a token: the first record wins. Returns 1 when recorded, else the value
-- recorded first, unchanged. A completed key keeps no steps: its record answers every repeat,
-- so a step recorded after the completion (a late write, an overlapping run) is not kept.
local held = redis.call('GET', KEYS[2])
if held and string.byte(held, 1) == 68 then
  return 1
end
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return redis.call('HGET', KEYS[1], ARGV[1])
end
-- Field 'r' (not a 32-byte step id: steps skips it) keeps the longest retention the steps were
-- recorded with, for renew.
local keep = tonumber(ARGV[3])
local kept = tonumber(redis.call('HGET', KEYS[1], 'r') or '')
if kept and kept >= keep then
  keep = kept
else
  redis.call('HSET', KEYS[1], 'r', ARGV[3])
end
-- While a claim holds the key the steps outlast its lease by their retention: a crash's retry
-- comes after the lease. Never shortened.
local until_ms = keep
if held and #held == 49 and string.byte(held, 1) == 80 then
  local lease = redis.call('PTTL', KEYS[2])
  if lease > 0 then
    until_ms = until_ms + lease
  end
end
if redis.call('PTTL', KEYS[1]) < until_ms then
  redis.call('PEXPIRE', KEYS[1], until_ms)
end
return 1
