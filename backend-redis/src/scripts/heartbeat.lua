-- A group member's heartbeat, after index.lua, for renew_check.lua and renew_versions.lua.
-- A heartbeat checks its key's name in the index only when the expiry index lacks it (see
-- heartbeat), since the expiry index holds only names the index holds. So a sweep checks that
-- the index holds every name of the expiry index: ZINTERCARD (Redis 7) counts the names in
-- both, O(names) in the server's C code, once per sweep; before Redis 7, fewer names in the
-- index than in the expiry index tells a loss of the whole index (deleted, or evicted apart
-- from the expiry index). After a loss every name of the expiry index is put back (one
-- ZUNIONSTORE) and the version of each of their directories changes, so every member's next
-- look lists them.
local function heal_index()
  local total = redis.call('ZCARD', EXP)
  if total == 0 then return end
  local ok, both = pcall(redis.call, 'ZINTERCARD', 2, IDX, EXP)
  if not ok then both = math.min(redis.call('ZCARD', IDX), total) end
  if both >= total then return end
  -- One name per directory, and none whose version key has moved away (a Cluster slot
  -- migrating): the next sweep heals then.
  local dirs, names = {}, {}
  for _, k in ipairs(redis.call('ZRANGE', EXP, 0, -1)) do
    local d = string.match(k, '^(.*:)')
    if d and not dirs[d] then
      if not here(version_key(k)) then return end
      dirs[d] = true
      names[#names + 1] = k
    end
  end
  redis.call('ZUNIONSTORE', IDX, 2, IDX, EXP, 'WEIGHTS', 1, 0, 'AGGREGATE', 'MIN')
  for _, k in ipairs(names) do changed(k) end
  settle()
end

-- Keeps the index keys at least MARGIN_MS past the latest expiry score (every live key expires
-- within MAX_QUIET_MS of its score), extending them by more than needed so that most sweeps
-- only read. An index without expiry (a key without TTL) is left so.
local function keep_index()
  heal_index()
  local p = redis.call('PTTL', IDX)
  if p == -1 then return end
  if p == -2 then
    settle()
    return
  end
  local last = redis.call('ZRANGE', EXP, -1, -1, 'WITHSCORES')
  if not last[2] then return end
  local need = tonumber(last[2]) + MARGIN_MS
  if now() + p < need then
    local at = ms(need + MAX_QUIET_MS)
    redis.call('PEXPIREAT', IDX, at)
    redis.call('PEXPIREAT', EXP, at)
  end
end

-- Version keys are kept alive (VERSION_TTL_MS) by the heartbeats that read them, but each
-- member only in a window of each third of that TTL, placed by a hash of its key so that the
-- members' windows spread out and a heartbeat rarely pays for it: `t` is the server time (the
-- quiet marker's, or the clock in a sweep), `ttl` the caller's TTL. Every member renews within
-- its TTL and markers live at most MAX_QUIET_MS, so a window twice that long holds the member's
-- calls, one that reads each of its directories among them (a group member reads the slot table
-- at least one heartbeat in four, that is within 4/3 of its TTL).
local function refresh_due(t, ttl, key)
  local period = VERSION_TTL_MS / 3
  local h = 0
  for i = 1, #key do h = (h * 31 + string.byte(key, i)) % period end
  return (t + h) % period < 2 * (ttl + MAX_QUIET_MS)
end

-- A heartbeat's renewal, from `v`, the value its MGET read at `key`: PEXPIRE to `ttl` ms when
-- it is `holder`. Returns whether it renewed, or nil and the {'foreign', key, type} answer when
-- the key holds another Redis type (MGET reads nil for it, told apart from absent by TYPE, off
-- the steady path). A key that holds another holder is put back in the index if it is missing
-- there (see repair), so the listing the caller reads next shows who holds it.
local function renew_held(key, v, holder, ttl)
  if not v then
    local kt = redis.call('TYPE', key)['ok']
    if kt ~= 'none' then
      return nil, {'foreign', key, 'a Redis ' .. kt}
    end
    return false
  end
  if v == holder then
    redis.call('PEXPIRE', key, ttl)
    return true
  end
  repair(key)
  return false
end

-- A heartbeat, after its MGET of the key to renew, the quiet marker and the version keys
-- `vks` (values `got`): scores the renewal of `key` (when `renewed`, with TTL `ttl` ms) and,
-- when the marker is gone, sweeps and sets a new marker that lives until the earliest expiry
-- score, within [`period`, min(ttl / 2, MAX_QUIET_MS)] ms. Returns the version of every
-- directory (one never written, or flushed, gets a new version above any earlier one).
--
-- A renewed key missing from both index keys (deleted, evicted, or left behind by a copy or
-- restore of the keys) is put back, and its directory's version changes, so every member's next
-- look lists it: a member renews within its TTL, so the index holds every live lease again
-- within one TTL of losing it. A loss of the index alone is healed whole by the next sweep
-- (heal_index), within a quiet marker's life.
--
-- So the steady state costs EVALSHA, MGET, PEXPIRE and one ZADD (the score; the name is
-- checked only when the expiry index lacked it); a sweep, once per marker life per index however
-- many members, adds TIME, ZRANGEBYSCORE, the earliest and latest score, SET of the marker, ZCARD
-- and ZINTERCARD (a lost index is healed: heal_index) and PTTL of the index (and, every few sweeps, the
-- index's expiry).
local function heartbeat(key, renewed, ttl, period, mark, vks, got)
  local out = {}
  local t
  local at, till = nil, nil
  if mark then at, till = string.match(mark, '^(%d+):(%d+)$') end
  -- A marker is believed only if it could have been set by a sweep: its end within
  -- MAX_QUIET_MS of its start (a value written by another client is swept over).
  if at then
    local a, b = tonumber(at), tonumber(till)
    if not (a <= b and b <= a + MAX_QUIET_MS) then at = nil end
  end
  if at then
    t = tonumber(at)
    if renewed then
      local score = t + ttl
      -- The name is checked in the index only when the expiry index lacked it (both lost, or
      -- a key copied in without them); a loss of the index alone is healed by the next sweep.
      if redis.call('ZADD', EXP, score, key) == 1 and redis.call('ZADD', IDX, 0, key) == 1 then
        changed(key)
        settle()
      end
      due_by(score, mark)
    end
  else
    local limit = 32
    sweeping = true
    local n = sweep(limit)
    sweeping = false
    t = now()
    if renewed then
      if redis.call('ZADD', EXP, t + ttl, key) == 1 and redis.call('ZADD', IDX, 0, key) == 1 then
        changed(key)
        settle()
      end
    end
    if n < limit then
      local life = math.min(math.floor(ttl / 2), MAX_QUIET_MS)
      local first = redis.call('ZRANGE', EXP, 0, 0, 'WITHSCORES')
      if first[2] then life = math.min(life, tonumber(first[2]) - t) end
      life = math.max(life, period, 1)
      redis.call('SET', QUIET, ms(t) .. ':' .. ms(t + life), 'PX', ms(life))
    elseif mark then
      redis.call('DEL', QUIET)
    end
    keep_index()
  end
  local refresh = refresh_due(t, ttl, key)
  for j = 1, #vks do
    out[j] = bumped[vks[j]] or got[j]
    if not out[j] then
      -- Never written through this index, or flushed: a version above any earlier one.
      bump(vks[j])
      out[j] = bumped[vks[j]]
    elseif refresh and not bumped[vks[j]] then
      redis.call('PEXPIRE', vks[j], VERSION_TTL_MS)
    end
  end
  return out
end
