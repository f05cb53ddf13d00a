-- The listing script before headcount's key index: a SCAN of the whole keyspace inside Lua,
-- kept for the benchmarks (the old design, and what a raw client listing a prefix does).
-- ARGV[1] = a SCAN MATCH pattern, ARGV[2] = the prefix.
local out = {'ok'}
local cursor = '0'
local plen = #ARGV[2]
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, k in ipairs(page[2]) do
    if string.sub(k, 1, plen) == ARGV[2] then
      local t = redis.call('TYPE', k)['ok']
      if t == 'string' then
        out[#out + 1] = k
        out[#out + 1] = redis.call('GET', k)
      elseif t ~= 'none' then
        return {'foreign', k, 'a Redis ' .. t}
      end
    end
  end
until cursor == '0'
return out
