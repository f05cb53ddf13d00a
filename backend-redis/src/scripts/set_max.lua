-- headcount set_max: KEYS[1] = key, then the index keys (index.lua), ARGV[1] = the new value
-- (decimal i64), ARGV[2] = TTL in milliseconds or ''. Writes when the key is absent or holds a smaller number. Returns 1 when it
-- wrote, 0 when not, {'foreign', value-or-type} when the stored value is not a decimal i64.
--
-- Lua numbers are doubles, exact only to 2^53, so numbers are compared as decimal text.

-- Splits canonical decimal i64 text ("0", or an optional '-' then 1-9 then digits: what INCR
-- accepts and headcount's parse_counter too) into (negative, digits), or nil.
local function parse(s)
  if s == '0' then return false, '0' end
  local sign, digits = string.match(s, '^(%-?)([1-9]%d*)$')
  if not digits then return nil end
  local neg = sign == '-'
  local limit = neg and '9223372036854775808' or '9223372036854775807'
  if #digits > 19 or (#digits == 19 and digits > limit) then return nil end
  return neg, digits
end

-- Whether a < b for two parsed numbers.
local function less(an, ad, bn, bd)
  if an ~= bn then return an end
  local smaller_magnitude
  if #ad ~= #bd then
    smaller_magnitude = #ad < #bd
  elseif ad == bd then
    return false
  else
    smaller_magnitude = ad < bd
  end
  if an then return not smaller_magnitude end
  return smaller_magnitude
end

local cur, refused = read_string(KEYS[1])
if refused then return refused end
if cur then
  local cn, cd = parse(cur)
  if cn == nil then return {'foreign', cur} end
  local nn, nd = parse(ARGV[1])
  if not less(cn, cd, nn, nd) then
    -- Refused by a live key: put back in the index if it is missing there (index.lua).
    repair(KEYS[1])
    return 0
  end
end
if ARGV[2] == '' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
changed(KEYS[1])
track(KEYS[1], ARGV[2] == '' and -1 or tonumber(ARGV[2]), true)
return 1
