-- headcount renew_and_list_if_changed, the group member's heartbeat: renews KEYS[1] if it holds
-- the holder, then answers the version of the directory ARGV[1] and, only when that differs
-- from the caller's, the directory's listing (list_body.lua runs after this part, whose `out`
-- it builds; lib.rs calls this script only when the key and the directory share one index).
-- KEYS[1] = the key to renew, then the index keys (index.lua).
-- ARGV[1] = the directory, ARGV[2] = the holder, ARGV[3] = the TTL in ms, ARGV[4] = the
-- version the caller has ('' for none), ARGV[5] = the sweep period in ms.
-- Returns {renewed, version} when the version is the caller's, {renewed, version, 'ok', key1,
-- value1, ...} otherwise, or {'foreign', key, type}.
--
-- The steady state costs Redis three commands besides the EVALSHA: one MGET of the key, the
-- version and the sweep marker, PEXPIRE of the key, and ZADD of the key's expiry score (MGET
-- answers nil for a key of another type, so a nil key is told apart with TYPE, off the steady
-- path). The expiry
-- score is taken from the marker, which holds the server time of the last sweep and lives one
-- sweep period, so the score is at most a period early: the key is renewed (and re-scored) long
-- before it comes due, and a dead member's name comes due at most a period early, when the
-- sweep re-scores it once. Without the marker (a period passed), this call sweeps: TIME, the
-- due names (each checked and re-scored or removed, which changes its directory's version),
-- the index keys' expiry, and a new marker. So expiries are noticed within a sweep period or
-- two by whichever member beats first, and no call does more than a constant amount of work.
local renewed = 0
local vk = VBASE .. ARGV[1]
local swept_key = string.sub(IDX, 1, #IDX - 5) .. 'swept'
local got = redis.call('MGET', KEYS[1], vk, swept_key)
local v, version, mark = got[1], got[2], got[3]
if not v then
  local kt = redis.call('TYPE', KEYS[1])['ok']
  if kt ~= 'none' then
    return {'foreign', KEYS[1], 'a Redis ' .. kt}
  end
elseif v == ARGV[2] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  renewed = 1
end
if mark then
  if renewed == 1 then
    redis.call('ZADD', EXP, ms(tonumber(mark) + tonumber(ARGV[3])), KEYS[1])
  end
else
  local limit = 32
  local n = sweep(limit)
  if renewed == 1 then
    track(KEYS[1])
  end
  if n < limit then
    redis.call('SET', swept_key, ms(now()), 'PX', ARGV[5])
  end
  settle()
  -- Keep the version of a directory that is renewed but not written.
  if version then
    redis.call('PEXPIRE', vk, VERSION_TTL_MS)
  end
  version = redis.call('GET', vk)
end
if not version then
  -- Never written through this index, or flushed: a version above any earlier one.
  bump(vk)
  version = redis.call('GET', vk)
end
if version == ARGV[4] then
  return {renewed, version}
end
