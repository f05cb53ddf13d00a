-- headcount renew_and_versions: renews KEYS[1] if it holds the holder and answers the version of
-- each directory in ARGV[4..], with no listing (the caller lists a directory that changed with
-- renew_check.lua). A heartbeat that watches two directories costs one call instead of two.
-- KEYS[1] = the key to renew, then the index keys (index.lua; lib.rs calls this script only when
-- the key and every directory share one index).
-- ARGV[1] = the holder, ARGV[2] = the TTL in ms, ARGV[3] = the sweep period in ms, ARGV[4..] =
-- the directories.
-- Returns {renewed, version1, version2, ...}, or {'foreign', key, type}.
--
-- The steady state is renew_check.lua's: one MGET (the key, the sweep marker and every
-- version), PEXPIRE and ZADD; the sweep, when the marker is gone, is the same too.
local renewed = 0
local swept_key = string.sub(IDX, 1, #IDX - 5) .. 'swept'
local names = {KEYS[1], swept_key}
for i = 4, #ARGV do
  names[#names + 1] = VBASE .. ARGV[i]
end
local got = redis.call('MGET', unpack(names))
local v, mark = got[1], got[2]
if not v then
  local kt = redis.call('TYPE', KEYS[1])['ok']
  if kt ~= 'none' then
    return {'foreign', KEYS[1], 'a Redis ' .. kt}
  end
elseif v == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  renewed = 1
end
local out = {renewed}
if mark then
  if renewed == 1 then
    redis.call('ZADD', EXP, ms(tonumber(mark) + tonumber(ARGV[2])), KEYS[1])
  end
  for j = 3, #names do
    out[#out + 1] = got[j] or false
  end
else
  local limit = 32
  local n = sweep(limit)
  if renewed == 1 then
    track(KEYS[1])
  end
  if n < limit then
    redis.call('SET', swept_key, ms(now()), 'PX', ARGV[3])
  end
  settle()
  for j = 3, #names do
    -- Keep the version of a directory that is renewed but not written; read it after the sweep.
    if got[j] then
      redis.call('PEXPIRE', names[j], VERSION_TTL_MS)
    end
    out[#out + 1] = redis.call('GET', names[j]) or false
  end
end
for j = 2, #out do
  if not out[j] then
    -- Never written through this index, or flushed: a version above any earlier one.
    bump(names[j + 1])
    out[j] = redis.call('GET', names[j + 1])
  end
end
return out
