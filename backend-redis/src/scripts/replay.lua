end
-- Replay protection, after the script's body (lib.rs wraps the body in `local function body()`
-- ... `end`). The Redis Cluster client sends a request again on a new connection when the old
-- one failed, also when the first attempt ran and only its answer was lost; for a write that is
-- not idempotent (an increment, or an answer that depends on the state before: a
-- compare-and-set) that would apply it twice, or answer "not written" for a write it made.
-- So on Cluster each call carries a request id, its last argument, and the first run records
-- its answer under that id, beside the key's index (same hash slot), for a minute: a repeat
-- returns the recorded answer and writes nothing. On a single server the id is '' (the
-- connection manager never sends a request twice) and this costs nothing.
local RID = ARGV[#ARGV]
local RKEY = nil
if RID ~= '' then
  if IDX then
    RKEY = string.sub(IDX, 1, #IDX - 5) .. 'req:' .. RID
  elseif not string.find(KEYS[1], '{', 1, true) and not string.find(KEYS[1], '}', 1, true) then
    -- An untagged key (no index on Cluster): the whole name in braces hashes like the name.
    RKEY = '{' .. KEYS[1] .. '}:headcount:req:' .. RID
  end
end
if RKEY then
  local prev = redis.call('GET', RKEY)
  if prev then return cmsgpack.unpack(prev) end
end
local answer = body()
if RKEY and not (type(answer) == 'table' and answer.err) then
  redis.call('SET', RKEY, cmsgpack.pack(answer), 'PX', 60000)
end
return answer
