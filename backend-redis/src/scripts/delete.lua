-- headcount delete: KEYS[1] = key, then the index keys (index.lua).
-- Returns the number of keys removed (0 or 1); the key leaves the index either way.
local n = redis.call('DEL', KEYS[1])
untrack(KEYS[1])
done(nil)
return n
