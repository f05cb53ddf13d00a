-- headcount compare_and_delete: KEYS[1] = key, then the index keys (index.lua);
-- ARGV[1] = the value the key must hold. Returns 1 when it deleted, 0 when the key is absent or
-- holds something else; a key of another Redis type is reported as {'foreign', type}. A key
-- that refuses the delete is put back in the index if it is missing there (index.lua, repair).
local k = KEYS[1]
local cur, refused = read_string(k)
if refused then return refused end
if cur ~= ARGV[1] then
  if cur then repair(k) end
  return 0
end
redis.call('DEL', k)
if not untrack(k) then changed(k) end
return 1
