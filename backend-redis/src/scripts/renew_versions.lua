-- headcount renew_and_versions: renews KEYS[1] if it holds the holder and answers the version of
-- each directory in ARGV[4..], with no listing (the caller lists a directory that changed with
-- renew_check.lua). A heartbeat that watches two directories costs one call instead of two.
-- KEYS[1] = the key to renew, then the index keys (index.lua; store.rs calls this script only when
-- the key and every directory share one index).
-- ARGV[1] = the holder, ARGV[2] = the TTL in ms, ARGV[3] = the shortest life of the quiet
-- marker in ms (index.lua), ARGV[4..] = the directories.
-- Returns {renewed, version1, version2, ...}, or {'foreign', key, type}.
--
-- The steady state is renew_check.lua's: one MGET (the key, the quiet marker and every
-- version), PEXPIRE and one ZADD; the sweep, when the marker is gone, is the same too.
local names = {KEYS[1], QUIET}
for i = 4, #ARGV do
  names[#names + 1] = VBASE .. ARGV[i]
end
local got = redis.call('MGET', unpack(names))
local renewed, foreign = renew_held(KEYS[1], got[1], ARGV[1], ARGV[2])
if foreign then
  return foreign
end
local vks, held = {}, {}
for j = 3, #names do
  vks[#vks + 1] = names[j]
  held[#held + 1] = got[j] or false
end
local out = heartbeat(KEYS[1], renewed, tonumber(ARGV[2]), tonumber(ARGV[3]), got[2], vks, held)
table.insert(out, 1, renewed and 1 or 0)
return out
