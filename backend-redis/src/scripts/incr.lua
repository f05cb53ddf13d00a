-- headcount incr: KEYS[1] = key, then the index keys (index.lua); ARGV[1] = TTL in
-- milliseconds, or '' for none.
-- Returns {'ok', n}, or {'foreign', value-or-type} (nothing written).
-- The TTL applies only when this call creates the key, even if a live key held "0": PTTL first
-- (-2: absent) tells a call that creates it, and a live key's expiry stays as it was.
local before = redis.call('PTTL', KEYS[1])
local ok, n = pcall(redis.call, 'INCR', KEYS[1])
if not ok then
  -- Only a value INCR cannot count (not an integer, out of range, another type) is foreign; a
  -- fault of the store (OOM, READONLY after a failover, MISCONF) goes back as the error it is,
  -- so the client sees it as retryable.
  local msg = type(n) == 'table' and n.err or tostring(n)
  if not (string.find(msg, 'WRONGTYPE', 1, true) or string.find(msg, 'not an integer', 1, true)
      or string.find(msg, 'overflow', 1, true)) then
    return redis.error_reply(msg)
  end
  -- Not an integer, out of range, or not a string at all (WRONGTYPE): INCR wrote nothing.
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t == 'string' then
    return {'foreign', redis.call('GET', KEYS[1])}
  end
  return {'foreign', 'a Redis ' .. t}
end
counted(KEYS[1], before, ARGV[1])
return {'ok', n}
