end
-- Replay protection, after the script's body (scripts.rs wraps the body in `local function body()`
-- ... `end`). The Redis Cluster client sends a request again on a new connection when the old
-- one failed, also when the first attempt ran and only its answer was lost; for a write that is
-- not idempotent (an increment, or an answer that depends on the state before: a
-- compare-and-set) that would apply it twice, or answer "not written" for a write it made.
-- So on Cluster each call carries a request id, its last argument, and the first run records
-- its answer under that id at the request key, its last key (`{tag}:headcount:req:<id>`, in the
-- slot of the data key, declared so a migration redirects it with the rest), for a minute: a
-- repeat returns the recorded answer and writes nothing. On a single server the id is '' (the
-- connection manager never sends a request twice) and this costs nothing.
local RID = ARGV[#ARGV]
local RKEY = nil
if RID ~= '' then RKEY = KEYS[#KEYS] end
if RKEY then
  local prev = redis.call('GET', RKEY)
  if prev then return cmsgpack.unpack(prev) end
end
local answer = body()
if RKEY and not (type(answer) == 'table' and answer.err) then
  redis.call('SET', RKEY, cmsgpack.pack(answer), 'PX', 60000)
end
return answer
