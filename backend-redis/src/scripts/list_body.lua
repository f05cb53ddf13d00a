-- headcount list, the shared body of list and renew_and_list (scripts.rs appends what each returns
-- with concat!): reads the index (index.lua) of the prefix ARGV[1], never the keyspace, so it
-- costs O(log N + M) for M keys under the prefix and N in the index.
-- The index keys are real keys in the prefix's hash slot, passed in KEYS: on Redis Cluster the
-- call is routed (and redirected during a slot migration, MOVED/ASK) to wherever they are, so
-- the listing follows the data rather than a key name that never exists.
-- Builds `out` = {'ok', key1, value1, key2, value2, ...} in key order, or returns
-- {'foreign', key, type} when a key under the prefix holds another Redis type. A name whose key
-- is gone (expired, or deleted by another client) is dropped from the index.
local out = {'ok'}
if IDX then
  local prefix = ARGV[1]
  local plen = #prefix
  -- Keys are UTF-8, which never holds the byte 0xFF: [prefix, prefix..0xFF) is exactly the
  -- names that start with prefix.
  local names = redis.call('ZRANGEBYLEX', IDX, '[' .. prefix, '(' .. prefix .. '\255')
  local removed = sweep()
  -- MGET in chunks: one call per 512 names instead of one per name; it answers nil both for a
  -- missing key and for a key of another type, told apart by TYPE.
  local i = 1
  while i <= #names do
    local chunk = {}
    for j = i, math.min(i + 511, #names) do
      chunk[#chunk + 1] = names[j]
    end
    local values = redis.call('MGET', unpack(chunk))
    for j, k in ipairs(chunk) do
      local v = values[j]
      if v and string.sub(k, 1, plen) == prefix then
        out[#out + 1] = k
        out[#out + 1] = v
      elseif not v then
        local t = redis.call('TYPE', k)['ok']
        if t == 'none' then
          -- Its directory's version is undeclared when deeper than the prefix (index.lua, here).
          if here(version_key(k)) then
            untrack(k)
            removed = removed + 1
          end
        else
          return {'foreign', k, 'a Redis ' .. t}
        end
      end
    end
    i = i + 512
  end
  if removed > 0 then
    settle()
  end
end
