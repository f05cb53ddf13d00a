-- headcount's key index, put in front of every script that writes or lists keys (lib.rs joins
-- the files with concat!, after a first line `local D = <number of data keys>`).
--
-- Why: a listing must cost O(keys under the prefix), never O(keys in the database), so every key
-- headcount writes is recorded, by the same atomic script that writes it, in two sorted sets that
-- live in the key's hash slot:
--   KEYS[D + 1], the index: every key name headcount wrote, all scored 0, so ZRANGE BYLEX
--     answers a prefix in O(log N + M);
--   KEYS[D + 2], the expiry index: the names that have a TTL, scored by their absolute expiry in
--     milliseconds on the server's clock (TIME), so expired names are found without a scan.
-- Without them (an untagged key on Redis Cluster, which no index can share a slot with) nothing
-- is recorded. TIME in a script that writes needs effect replication, the only mode of Redis 7
-- and the default since Redis 5.
local IDX, EXP = KEYS[D + 1], KEYS[D + 2]
-- Expired names removed per call: a constant, so every script stays short, yet each creating
-- write removes more names than it adds, so the index stays close to the live keys.
local SWEEP = 8
-- The index keys outlive the last key they hold by this margin, so they never vanish first.
local MARGIN_MS = 1000
local now_ms = nil

local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return now_ms
end

-- Integer milliseconds as the text Redis expects (Lua numbers print as %.14g otherwise).
local function ms(x)
  return string.format('%.0f', x)
end

-- Records key k, which this script just wrote, with its current expiry (or none).
local function track(k)
  if not IDX then return end
  redis.call('ZADD', IDX, 0, k)
  local p = redis.call('PTTL', k)
  if p >= 0 then
    redis.call('ZADD', EXP, ms(now() + p), k)
  else
    redis.call('ZREM', EXP, k)
  end
end

-- Forgets key k (deleted, or found gone).
local function untrack(k)
  if not IDX then return end
  redis.call('ZREM', IDX, k)
  redis.call('ZREM', EXP, k)
end

-- Removes up to SWEEP names whose expiry has passed and whose key is gone. A key still there was
-- given a new expiry (or none) by another client: it is re-scored instead.
local function sweep()
  if not IDX then return 0 end
  local due = redis.call('ZRANGEBYSCORE', EXP, '-inf', ms(now()), 'LIMIT', 0, SWEEP)
  for _, k in ipairs(due) do
    local p = redis.call('PTTL', k)
    if p == -2 then
      untrack(k)
    elseif p == -1 then
      redis.call('ZREM', EXP, k)
    else
      redis.call('ZADD', EXP, ms(now() + p), k)
    end
  end
  return #due
end

-- Gives the index keys the expiry of the last key they hold when every one of those keys has a
-- TTL, so the index of a prefix nobody writes any more disappears with its keys; else none.
local function settle()
  if not IDX then return end
  local n = redis.call('ZCARD', IDX)
  if n == 0 then return end
  if redis.call('ZCARD', EXP) < n then
    redis.call('PERSIST', IDX)
    redis.call('PERSIST', EXP)
  else
    local last = redis.call('ZRANGE', EXP, -1, -1, 'WITHSCORES')
    local at = ms(tonumber(last[2]) + MARGIN_MS)
    redis.call('PEXPIREAT', IDX, at)
    redis.call('PEXPIREAT', EXP, at)
  end
end

-- Every write ends with this: a bounded sweep, then the index keys' own expiry.
local function done(k)
  if k then track(k) end
  sweep()
  settle()
end
