-- headcount compare_and_set with an expected value (expected None is a plain SET NX).
-- KEYS[1] = key, ARGV[1] = expected, ARGV[2] = new, ARGV[3] = TTL in milliseconds or ''.
-- Returns 1 when it wrote, 0 when the key is absent or holds something else; a key of another
-- Redis type is reported as {'foreign', type}.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' then
  if t == 'none' then return 0 end
  return {'foreign', 'a Redis ' .. t}
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], ARGV[2])
else
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
end
return 1
