-- headcount fence: admit a fencing token if it is at least the highest one admitted, and on
-- admission write the guarded data in the same atomic step.
-- KEYS[1] = the fence key; KEYS[2], when given, = the data key (same hash slot on Cluster).
-- ARGV[1] = the token (canonical decimal text of a u64), ARGV[2] = the data value,
-- ARGV[3] = the data's TTL in milliseconds, or '' for none.
-- Returns 1 (admitted; token recorded, data written), 0 (refused; nothing written), or
-- {'foreign', what} when the fence key holds anything but a token (nothing written).
-- Tokens are compared as decimal text (length first, then bytes): Lua numbers are doubles and
-- would round tokens above 2^53.
local t = redis.call('TYPE', KEYS[1])['ok']
if t ~= 'string' and t ~= 'none' then
  return {'foreign', 'a Redis ' .. t}
end
local tok = ARGV[1]
if t == 'string' then
  local cur = redis.call('GET', KEYS[1])
  local canonical = (cur == '0' or string.match(cur, '^[1-9]%d*$') ~= nil)
    and (#cur < 20 or (#cur == 20 and cur <= '18446744073709551615'))
  if not canonical then
    return {'foreign', cur}
  end
  if #cur > #tok or (#cur == #tok and cur > tok) then
    return 0
  end
end
-- A plain SET: the fence key never expires (a fence that forgot its highest token would admit
-- stale owners again).
redis.call('SET', KEYS[1], tok)
if #KEYS > 1 then
  if ARGV[3] == '' then
    redis.call('SET', KEYS[2], ARGV[2])
  else
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
end
return 1
