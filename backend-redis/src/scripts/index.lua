-- headcount's key index, put in front of every script that writes or lists keys (scripts.rs
-- joins the files with concat!, after a first line `local D = <number of data keys>`). The
-- helpers only the increments call are in counter.lua, those only a heartbeat calls in
-- heartbeat.lua: Lua creates every function of a script on each call.
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
-- deletes or changes a key of the directory (and every sweep that finds one expired) sets to
-- `<µs>.<random>`: the server time in microseconds, or one above its last value if that is
-- higher, then a random number (see bump). A group member's heartbeat reads it (renew_check.lua)
-- and reads the directory only when it changed.
--
-- The index is data like any other: it can be deleted, evicted, or left behind when keys are
-- copied or restored without it. So it heals: every script that finds a live key missing from it
-- (a renewal, a sweep, a write, a write refused because the key exists) puts the key back and
-- changes its directory's version, so the next look of every member lists it (see repair).
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
-- The quiet marker: `<index name less 'index'>quiet`, a string `<t>:<until>` set by a
-- heartbeat's sweep at server time t (ms) and living until `until`, no later than the earliest
-- expiry score in the index (see heartbeat). While it lives nothing is due, so a heartbeat
-- neither reads the clock nor sweeps, and it scores its renewal at t + its TTL: early by at most
-- the marker's life, never late.
local QUIET = IDX and (string.sub(IDX, 1, #IDX - 5) .. 'quiet')
-- The longest a quiet marker lives, so the longest a renewal's score may be early.
local MAX_QUIET_MS = 5000
-- The index keys outlive the last key they hold by this margin, so they never vanish first: a
-- live key expires at most MAX_QUIET_MS after its score (see above), and every sweep of a
-- heartbeat keeps the index that far past the latest score (keep_index).
local MARGIN_MS = MAX_QUIET_MS + 1000
local now_ms, now_us = nil, nil

local function now()
  if not now_ms then
    local t = redis.call('TIME')
    now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
    now_ms = math.floor(now_us / 1000)
  end
  return now_ms
end

-- Integer milliseconds as the text Redis expects (Lua numbers print as %.14g otherwise), for a
-- value stored, compared or returned as text, or given to a command that wants an integer
-- (PEXPIRE, PEXPIREAT). A sorted-set score or range bound is passed as a number instead:
-- redis.call sends it exactly (integers below 2^53 are exact doubles) and parses it back as a
-- double, without the 0.3 µs that string.format costs in a script.
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

-- The versions this script set, by version key.
local bumped = {}

-- Sets version key vk to a new version, `<n>.<random>` with n above its last number and the
-- clock: one SET ... GET (Redis 6.2 and later), and a second SET only in the rare call whose
-- clock reads at or below the last version (a clock stepped back, or a second change in one
-- microsecond). The number alone would repeat after a rollback on a server whose clock is behind
-- the versions it minted (a backward step, a failover to a replica whose clock lags): "one above
-- the last" walks the same numbers again, for other contents. The random part (Redis 7 seeds
-- the scripts' generator afresh for every call; before 7 it is the same each call, and versions
-- rely on the clock alone) makes two versions equal only by a 2^-31 chance.
local function bump(vk)
  now()
  local v = now_us
  local tag = '.' .. string.format('%x', math.random(0, 2147483647))
  local text = ms(v) .. tag
  local ok, old = pcall(redis.call, 'SET', vk, text, 'PX', VERSION_TTL_MS, 'GET')
  if not ok then
    -- A server before 6.2 (no GET option) or another Redis type at vk: SET wrote nothing.
    old = redis.pcall('GET', vk)
    if type(old) ~= 'string' then old = nil end
  end
  -- The number of `<n>.<random>`, or of a bare number (written by an earlier version).
  local last = type(old) == 'string' and tonumber(string.match(old, '^%d+')) or nil
  if last and last >= v then
    v = last + 1
    text = ms(v) .. tag
  end
  bumped[vk] = text
  if not ok or v ~= now_us then
    redis.call('SET', vk, bumped[vk], 'PX', VERSION_TTL_MS)
  end
end

-- Ends the quiet marker by `at` (server ms), a new expiry score: a key due before the marker
-- ends must be swept when it comes due. `mark` is the marker's value, when already read.
-- A heartbeat that sweeps sets the marker from the earliest score afterwards, so it skips this.
local sweeping = false
local function due_by(at, mark)
  if not QUIET or sweeping then return end
  if not mark then
    mark = redis.pcall('GET', QUIET)
    if type(mark) == 'table' then
      -- Another Redis type at the marker's name: replaced by the next heartbeat's sweep.
      redis.call('DEL', QUIET)
      return
    end
  end
  if not mark then return end
  local t, till = string.match(mark, '^(%d+):(%d+)$')
  if not t then
    redis.call('DEL', QUIET)
  elseif tonumber(till) > at then
    redis.call('SET', QUIET, t .. ':' .. ms(at))
    redis.call('PEXPIREAT', QUIET, ms(math.max(at, 1)))
  end
end

-- The string at `k`, or false when absent; on another Redis type (GET refuses it) the reply to
-- return instead: one GET on the common path, TYPE only for a refusal.
local function read_string(k)
  local ok, v = pcall(redis.call, 'GET', k)
  if ok then return v end
  local t = redis.call('TYPE', k)['ok']
  if t ~= 'string' and t ~= 'none' then return nil, {'foreign', 'a Redis ' .. t} end
  return nil, redis.error_reply(type(v) == 'table' and v.err or tostring(v))
end

-- Records that key k's directory changed (once per script: one new version says it), and
-- tells its subscribers (notify.rs): one PUBLISH of an empty message on
-- `headcount:changed:<directory>`, O(subscribers of that channel). Through pcall: a user whose
-- ACL refuses PUBLISH still writes (its peers then learn of the change by polling).
local function changed(k)
  local vk = version_key(k)
  if vk and not bumped[vk] then
    bump(vk)
    redis.pcall('PUBLISH', 'headcount:changed:' .. string.sub(vk, #VBASE + 1), '')
  end
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

-- Scores key k, which lives `p` more ms, in the expiry index. Returns whether it had no score.
local function score(k, p)
  local added = redis.call('ZADD', EXP, now() + p, k) == 1
  -- Only a key with a shorter TTL than a marker may live can come due before it ends.
  if p < MAX_QUIET_MS then due_by(now() + p) end
  return added
end

-- Puts key k, found live by this script, back in the index when the index lost it (deleted,
-- evicted, copied or restored without it) or never held it (written by another client): scored
-- by its TTL, and its directory's version changed, so that every member's next look lists it
-- and a write refused because k exists is followed by a read that shows why. One ZADD when the
-- index holds k, as it nearly always does. Returns whether k was missing.
local function repair(k)
  if not IDX or redis.call('ZADD', IDX, 0, k) == 0 then return false end
  local p = redis.call('PTTL', k)
  if p == -2 then
    -- Not live after all: nothing to list.
    redis.call('ZREM', IDX, k)
    return false
  end
  if p >= 0 then score(k, p) else redis.call('ZREM', EXP, k) end
  changed(k)
  settle()
  return true
end

-- On Cluster a script may touch only the keys of its node. The callers declare the keys of the
-- steady path (the index keys, the quiet marker, the versions of the directories they write or
-- read: store.rs), so that while the slot migrates and one of them has moved Redis answers
-- TRYAGAIN or ASK before the script runs. What a sweep touches (a due name, the version of its
-- directory) cannot be declared, and touching it once it has moved would fail the whole call
-- ("non local key") after its renewal: the sweep stops before such a key instead, and a later
-- call sweeps what is left. Whether key k can be touched here (always, on a single server).
local CLUSTER = IDX ~= nil and string.sub(IDX, 1, 1) == '{'
local function here(k)
  return not CLUSTER or k == nil or (pcall(redis.call, 'EXISTS', k))
end

-- Forgets key k (deleted, or found gone). Returns whether the index held it: its directory
-- changed then.
local function untrack(k)
  if not IDX then return false end
  local held = redis.call('ZREM', IDX, k) == 1
  local scored = redis.call('ZREM', EXP, k) == 1
  if held or scored then changed(k) end
  -- A key without TTL kept the index keys from expiring: perhaps none is left.
  if held and not scored then settle() end
  return held or scored
end

-- Removes up to `limit` (default SWEEP) names whose expiry has passed and whose key is gone. A
-- key still there was renewed (a heartbeat scores its renewal early, by up to a quiet marker's
-- life: see heartbeat) or given another expiry by another client: it is re-scored instead, and
-- put back in the index if the index lost it (the expiry index survived it), which changes its
-- directory's version.
local function sweep(limit)
  if not IDX then return 0 end
  local due = redis.call('ZRANGEBYSCORE', EXP, '-inf', now(), 'LIMIT', 0, limit or SWEEP)
  local repaired = false
  for _, k in ipairs(due) do
    if not here(k) or not here(version_key(k)) then break end
    local p = redis.call('PTTL', k)
    if p == -2 then
      untrack(k)
    else
      if p == -1 then
        -- Persisted by another client: so is the index, which must not expire before it.
        redis.call('ZREM', EXP, k)
        redis.call('PERSIST', IDX)
        redis.call('PERSIST', EXP)
      else
        redis.call('ZADD', EXP, now() + p, k)
        if p < MAX_QUIET_MS then due_by(now() + p) end
      end
      if redis.call('ZADD', IDX, 0, k) == 1 then
        changed(k)
        repaired = true
      end
    end
  end
  if repaired then settle() end
  return #due
end

-- Makes the index keys outlive, by MARGIN_MS, a key just given a TTL of `p` ms (-1: none, so
-- they must not expire at all). They are extended by more than needed, so that most writes
-- only read their PTTL.
local function cover(p)
  local pi = redis.call('PTTL', IDX)
  if pi == -1 then return end
  if p < 0 then
    redis.call('PERSIST', IDX)
    redis.call('PERSIST', EXP)
  elseif pi < p + MARGIN_MS then
    local keep = ms(p + MARGIN_MS + math.max(MAX_QUIET_MS, math.floor(p / 2)))
    redis.call('PEXPIRE', IDX, keep)
    redis.call('PEXPIRE', EXP, keep)
  end
end

-- Records key k, which this script just wrote and which now has a TTL of `p` ms (-1: none),
-- then sweeps. `moved` is false when the write left the key's expiry as it was (an increment of
-- a live key with a TTL): only the name is checked then, so a TTL another client gave the key
-- meanwhile is noticed by the next write that moves its expiry, or by a sweep. So a write of a
-- key already recorded costs a ZADD of its name and the sweep's ZRANGEBYSCORE, and when its
-- expiry moved a ZADD of its score and a PTTL of the index; only a key new to the index, one
-- that gains a TTL, or a sweep that re-scored a name settles the index's expiry (a key that
-- loses its TTL makes the index persistent).
local function track(k, p, moved)
  if not IDX then return end
  local fresh = redis.call('ZADD', IDX, 0, k) == 1
  if fresh then
    -- Created, written before by a client that keeps no index, or lost by the index: new to
    -- every listing either way. The index keys may be new too, so their expiry is set from
    -- what they hold.
    if p >= 0 then score(k, p) else redis.call('ZREM', EXP, k) end
    changed(k)
    settle()
  elseif moved then
    if p < 0 then
      -- Unconditionally: the expiry set may have been lost (evicted, deleted) while the index
      -- kept an expiry, which this key no longer bounds.
      redis.call('ZREM', EXP, k)
      cover(-1)
    elseif score(k, p) then
      -- It had no TTL, which kept the index keys from expiring: perhaps none is left.
      settle()
    else
      cover(p)
    end
  end
  -- A sweep may re-score a key another client gave a longer TTL: the index keys must then
  -- outlive it too.
  if sweep() > 0 then settle() end
end

