-- headcount expire: KEYS[1] = key, then the index keys (index.lua); ARGV[1] = TTL in ms.
-- Returns 1 when the key was live and got the TTL, else 0 (nothing created).
local n = redis.call('PEXPIRE', KEYS[1], ARGV[1])
if n == 1 then
  track(KEYS[1], tonumber(ARGV[1]), true)
end
return n
