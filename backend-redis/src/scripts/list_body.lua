-- headcount list, the shared body of list and renew_and_list (lib.rs appends what each returns
-- with concat!): ARGV[1] = a SCAN MATCH pattern (the prefix with glob characters escaped),
-- ARGV[2] = the prefix itself. The prefix is also passed as a key, only so Redis Cluster runs
-- the script on the node that owns the prefix's hash slot.
-- Builds `out` = {'ok', key1, value1, key2, value2, ...} (unsorted), or returns
-- {'foreign', key, type} when a key under the prefix holds another Redis type.
-- SCAN sees every key present for the whole scan; the script runs atomically, so the result is
-- one snapshot.
local out = {'ok'}
local cursor = '0'
local plen = #ARGV[2]
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[1], 'COUNT', 1000)
  cursor = page[1]
  for _, k in ipairs(page[2]) do
    -- MATCH is a glob; the byte comparison makes "starts with" exact whatever the pattern does.
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
