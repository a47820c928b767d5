-- POST /orders for wrk: the load benchmark's wrk mode (loadtest/run.sh --mode wrk; BENCHMARKS.md).
--
--   wrk -t1 -c64 -d10s -s loadtest/wrk/orders.lua http://127.0.0.1:PORT -- MODE BODY PREFIX KEYS
--
-- MODE fresh: a new Idempotency-Key on every request (PREFIX .. n).
-- MODE replay: KEYS keys (PREFIX .. 0 … KEYS-1) cycled; the driver stores each once first.
-- BODY: a file holding the JSON order. Every request carries Content-Type, a bearer token (the
-- caller: one principal for the whole run), a Cookie and the key as an sf-string.
-- done() prints one JSON line the driver parses.

local mode, prefix, nkeys, body
local n = 0
local prepared = {}
-- fresh: the request around its key, so that each request is one concatenation (wrk.format per
-- request would make the generator, not the server, the limit).
local before, after
local headers = {
  ["Content-Type"] = "application/json",
  ["Authorization"] = "Bearer client-0042",
  ["Cookie"] = "session=9f86d081884c7d659a2feaa0c55ad015; theme=dark",
}

function init(args)
  mode = args[1]
  prefix = args[3]
  nkeys = tonumber(args[4] or "100")
  local f = assert(io.open(args[2], "rb"))
  body = f:read("*a")
  f:close()
  if mode == "replay" then
    for i = 0, nkeys - 1 do
      headers["Idempotency-Key"] = '"' .. prefix .. i .. '"'
      prepared[i + 1] = wrk.format("POST", "/orders", headers, body)
    end
  elseif mode == "fresh" then
    headers["Idempotency-Key"] = '"\1KEY\1"'
    local whole = wrk.format("POST", "/orders", headers, body)
    local at = assert(string.find(whole, "\1KEY\1", 1, true))
    before = string.sub(whole, 1, at - 1)
    after = string.sub(whole, at + 5)
  else
    error("MODE is fresh or replay")
  end
end

function request()
  n = n + 1
  if mode == "replay" then
    return prepared[(n % nkeys) + 1]
  end
  return before .. prefix .. n .. after
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,' ..
    '"non_2xx_3xx":%d,"socket_errors":%d}\n',
    summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    e.status, e.connect + e.read + e.write + e.timeout))
end
