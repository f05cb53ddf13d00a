-- The increment's index upkeep, after index.lua, for incr.lua and incr_and_get.lua.
-- After an increment of counter k whose PTTL was `before` (-2: absent): gives the key it created
-- the TTL `ttl` (ms as text, '' for none; a live key's expiry stays), and records the change.
local function counted(k, before, ttl)
  local created = before == -2
  local p = before
  if created then
    p = -1
    if ttl ~= '' then
      redis.call('PEXPIRE', k, ttl)
      p = tonumber(ttl)
    end
  end
  changed(k)
  -- A live key without TTL is checked as if moved: cheap (a ZREM, and a PTTL of an index that
  -- is persistent then), and it keeps the index persistent after another client's PERSIST.
  track(k, p, created or before == -1)
end

