-- headcount renew_and_list, the renewal that runs before the shared listing body:
-- KEYS[1] = the key to renew, KEYS[2] = the prefix (same hash slot on Cluster),
-- ARGV[1], ARGV[2] = the listing's pattern and prefix (see list_body.lua),
-- ARGV[3] = the holder the key must hold, ARGV[4] = the new TTL in milliseconds.
-- Returns {renewed (1 or 0), 'ok', key1, value1, ...}, or {'foreign', key, type} when the key
-- (or a key under the prefix) holds another Redis type; nothing is written then.
local renewed = 0
local kt = redis.call('TYPE', KEYS[1])['ok']
if kt ~= 'string' and kt ~= 'none' then
  return {'foreign', KEYS[1], 'a Redis ' .. kt}
end
if kt == 'string' and redis.call('GET', KEYS[1]) == ARGV[3] then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  renewed = 1
end
