-- headcount incr: KEYS[1] = key, ARGV[1] = TTL in milliseconds, or '' for none.
-- Returns {'ok', n}, or {'foreign', value-or-type} (nothing written).
-- EXISTS first: the TTL applies only when this call creates the key, even if a live key held "0".
local created = redis.call('EXISTS', KEYS[1]) == 0
local ok, n = pcall(redis.call, 'INCR', KEYS[1])
if not ok then
  -- Not an integer, out of range, or not a string at all (WRONGTYPE): INCR wrote nothing.
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t == 'string' then
    return {'foreign', redis.call('GET', KEYS[1])}
  end
  return {'foreign', 'a Redis ' .. t}
end
if created and ARGV[1] ~= '' then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return {'ok', n}
