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
--
-- Each directory (the text of a key up to its last ':') also has a version, a string key in the
-- same slot, `<index name less 'index'>version:<directory>`, which every write that creates,
-- deletes or changes a key of the directory (and every sweep that finds one expired) sets to the
-- server time in microseconds, or one above its last value if that is higher: so a version never
-- comes back, even after a flush. A group member's heartbeat reads it (renew_check.lua) and
-- reads the directory only when it changed.
-- A replay-protected call on Cluster (REPLAY, with a request id as its last argument) has its
-- request key last, after the index keys or, for a key without an index, right after its data.
local NX = #KEYS - D
if REPLAY and ARGV[#ARGV] ~= '' then NX = NX - 1 end
local IDX, EXP = nil, nil
if NX >= 2 then IDX, EXP = KEYS[D + 1], KEYS[D + 2] end
local VBASE = IDX and (string.sub(IDX, 1, #IDX - 5) .. 'version:')
-- Expired names removed per call: a constant, so every script stays short, yet each creating
-- write removes more names than it adds, so the index stays close to the live keys.
local SWEEP = 8
-- The index keys outlive the last key they hold by this margin, so they never vanish first. A
-- heartbeat (renew_check.lua) scores its renewal up to a sweep period (at most 500 ms) early and
-- settles only when it sweeps, after scoring its own key exactly: the renewals after that settle
-- end within a sweep period of it, inside the margin.
local MARGIN_MS = 1000
local now_ms, now_us = nil, nil

local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
  return now_ms
end

-- Integer milliseconds as the text Redis expects (Lua numbers print as %.14g otherwise).
local function ms(x)
  return string.format('%.0f', x)
end

-- The version key of key k's directory, or nil (no index, or no ':' in k).
local function version_key(k)
  if not IDX then return nil end
  local d = string.match(k, '^(.*:)')
  if not d then return nil end
  return VBASE .. d
end

-- A version key lives as long as the index may (see settle) and at least this long after its
-- last change or refresh, so a directory nobody writes keeps its version while it is renewed.
local VERSION_TTL_MS = 3600000

-- Sets version key vk to a new version, above its last and the clock.
local function bump(vk)
  now()
  local v = (tonumber(redis.call('GET', vk)) or 0) + 1
  if now_us > v then v = now_us end
  redis.call('SET', vk, ms(v), 'PX', VERSION_TTL_MS)
end

-- Records that key k's directory changed.
local function changed(k)
  local vk = version_key(k)
  if vk then bump(vk) end
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

-- Forgets key k (deleted, or found gone): its directory changed.
local function untrack(k)
  if not IDX then return end
  redis.call('ZREM', IDX, k)
  redis.call('ZREM', EXP, k)
  changed(k)
end

-- Removes up to `limit` (default SWEEP) names whose expiry has passed and whose key is gone. A
-- key still there was renewed (a heartbeat scores its renewal a little early, see
-- renew_check.lua) or given another expiry by another client: it is re-scored instead.
local function sweep(limit)
  if not IDX then return 0 end
  local due = redis.call('ZRANGEBYSCORE', EXP, '-inf', ms(now()), 'LIMIT', 0, limit or SWEEP)
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
