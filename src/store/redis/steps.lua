-- steps: every step of KEYS[1] (the key's steps hash) as field, value, field, value…
-- A script, not a bare HGETALL, so that clients route it to the primary and never answer it
-- from a replica or a client-side cache: a missed step would run its side effect again.
return redis.call('HGETALL', KEYS[1])
