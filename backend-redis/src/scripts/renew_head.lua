-- headcount renew_and_list, the renewal that runs before the shared listing body:
-- KEYS[1] = the key to renew, then the index keys (index.lua) of both the key and the prefix
-- (Rust calls this script only when they are the same: one server, or one hash tag on Cluster).
-- ARGV[1] = the listing's prefix (see list_body.lua), ARGV[2] = the holder the key must hold,
-- ARGV[3] = the new TTL in milliseconds.
-- Returns {renewed (1 or 0), 'ok', key1, value1, ...}, or {'foreign', key, type} when the key
-- (nothing renewed then) or a key under the prefix holds another Redis type.
local renewed = 0
local kt = redis.call('TYPE', KEYS[1])['ok']
if kt ~= 'string' and kt ~= 'none' then
  return {'foreign', KEYS[1], 'a Redis ' .. kt}
end
if kt == 'string' and redis.call('GET', KEYS[1]) == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  track(KEYS[1], tonumber(ARGV[3]), true)
  renewed = 1
elseif kt == 'string' then
  -- Another holder's: the listing below must show it (index.lua, repair).
  repair(KEYS[1])
end
