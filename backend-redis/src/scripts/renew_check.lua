-- headcount renew_and_list_if_changed, the group member's heartbeat: renews KEYS[1] if it holds
-- the holder, then answers the version of the directory ARGV[1] and, only when that differs
-- from the caller's, the directory's listing (list_body.lua runs after this part, whose `out`
-- it builds; store.rs calls this script only when the key and the directory share one index).
-- KEYS[1] = the key to renew, then the index keys (index.lua).
-- ARGV[1] = the directory, ARGV[2] = the holder, ARGV[3] = the TTL in ms, ARGV[4] = the
-- version the caller has ('' for none), ARGV[5] = the shortest life of the quiet marker in ms (index.lua).
-- Returns {renewed, version} when the version is the caller's, {renewed, version, 'ok', key1,
-- value1, ...} otherwise, or {'foreign', key, type}.
--
-- The steady state costs Redis three commands besides the EVALSHA: one MGET of the key, the
-- quiet marker and the version, PEXPIRE of the key, and ZADD of the key's expiry score (its
-- name is checked in the index only when that ZADD added it: see heartbeat in heartbeat.lua) (MGET
-- answers nil for a key of another type, so a nil key is told apart with TYPE, off the steady
-- path). When the marker is gone (something may be due), this call sweeps: see heartbeat in
-- index.lua. So expiries are noticed by whichever member calls first after they come due, and no
-- call does more than a constant amount of work.
local vk = VBASE .. ARGV[1]
local got = redis.call('MGET', KEYS[1], QUIET, vk)
local renewed, foreign = renew_held(KEYS[1], got[1], ARGV[2], ARGV[3])
if foreign then
  return foreign
end
local version = heartbeat(
  KEYS[1], renewed, tonumber(ARGV[3]), tonumber(ARGV[5]), got[2], {vk}, {got[3]}
)[1]
renewed = renewed and 1 or 0
if version == ARGV[4] then
  return {renewed, version}
end
