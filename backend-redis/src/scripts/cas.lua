-- headcount compare_and_set: KEYS[1] = key, then the index keys (index.lua).
-- ARGV[1] = expected, ARGV[2] = new, ARGV[3] = TTL in milliseconds or '', ARGV[4] = '1' when
-- the expected value is "absent" (ARGV[1] is then ignored).
-- Returns 1 when it wrote, 0 when the key is absent or holds something else; a key of another
-- Redis type is reported as {'foreign', type}. A key that refuses the write is put back in the
-- index if it is missing there (index.lua, repair), so the caller's next listing shows it.
local k = KEYS[1]
local function write()
  if ARGV[3] == '' then
    redis.call('SET', k, ARGV[2])
  else
    redis.call('SET', k, ARGV[2], 'PX', ARGV[3])
  end
  -- A write of the value the key already held (a renewal through compare-and-set) changes no
  -- listing.
  if ARGV[4] == '1' or ARGV[1] ~= ARGV[2] then changed(k) end
  track(k, ARGV[3] == '' and -1 or tonumber(ARGV[3]), true)
  return 1
end
if ARGV[4] == '1' then
  -- Only if absent: any live key, of any type, stops the write (as SET NX does).
  if redis.call('EXISTS', k) == 1 then
    repair(k)
    return 0
  end
  return write()
end
local cur, refused = read_string(k)
if refused then return refused end
if cur ~= ARGV[1] then
  if cur then repair(k) end
  return 0
end
return write()
