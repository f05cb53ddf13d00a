-- headcount incr_and_get: KEYS[1] = the counter, KEYS[2] = the key to read (same hash slot on
-- Cluster), then the counter's index keys (index.lua), ARGV[1] = how much to add (>= 1),
-- ARGV[2] = TTL in milliseconds, or '' for none.
-- Returns {'ok', n, value-or-nil}, {'foreign', value-or-type} for the counter (nothing written),
-- or {'foreign-read', type} when the key to read is not a string.
-- PTTL first (-2: absent) tells a call that creates the counter; a live one's expiry stays.
local before = redis.call('PTTL', KEYS[1])
local ok, n = pcall(redis.call, 'INCRBY', KEYS[1], ARGV[1])
if not ok then
  -- Only a value INCR cannot count (not an integer, out of range, another type) is foreign; a
  -- fault of the store (OOM, READONLY after a failover, MISCONF) goes back as the error it is,
  -- so the client sees it as retryable.
  local msg = type(n) == 'table' and n.err or tostring(n)
  if not (string.find(msg, 'WRONGTYPE', 1, true) or string.find(msg, 'not an integer', 1, true)
      or string.find(msg, 'overflow', 1, true)) then
    return redis.error_reply(msg)
  end
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t == 'string' then
    return {'foreign', redis.call('GET', KEYS[1])}
  end
  return {'foreign', 'a Redis ' .. t}
end
counted(KEYS[1], before, ARGV[2])
local t = redis.call('TYPE', KEYS[2])['ok']
if t == 'none' then
  return {'ok', n}
end
if t ~= 'string' then
  return {'foreign-read', 'a Redis ' .. t}
end
-- A live key read is put back in the index if it is missing there (index.lua, repair).
repair(KEYS[2])
return {'ok', n, redis.call('GET', KEYS[2])}
