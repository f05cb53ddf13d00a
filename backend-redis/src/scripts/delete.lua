-- headcount delete: KEYS[1] = key, then the index keys (index.lua).
-- Returns the number of keys removed (0 or 1); the key leaves the index either way, and the
-- directory's version changes when there was something to remove.
local n = redis.call('DEL', KEYS[1])
if not untrack(KEYS[1]) and n == 1 then changed(KEYS[1]) end
return n
