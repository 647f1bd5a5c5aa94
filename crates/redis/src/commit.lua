-- sluice: one batch, atomically (see sink.rs and render.rs for the
-- argument layout: each call is name, key index, argument count, arguments).
--
-- A script is atomic but not rolled back: everything that could fail is
-- checked first (the offsets compare-and-set, the type of every key
-- written, the integers INCRBY/HINCRBY add to), and only then is anything
-- written. The host validated the arguments themselves before the call.
--
-- KEYS[1] checkpoints hash, KEYS[2] lineage list, KEYS[3] dead letter
-- list, KEYS[4..] the keys the batch writes, then its keyed-state hashes.

local at = 1
local function take()
  local v = ARGV[at]
  at = at + 1
  return v
end

-- 1. The compare-and-set of every partition's next offset.
local moves = {}
for _ = 1, tonumber(take()) do
  local field = take()
  local from = take()
  local untl = take()
  local stored = redis.call('HGET', KEYS[1], field)
  if stored and stored ~= from then
    return {'fenced', field, stored}
  end
  moves[#moves + 1] = field
  moves[#moves + 1] = untl
end
local lineage = take()
local keep = tonumber(take())
local dead_keep = tonumber(take())
local n_dead = tonumber(take())
local dead_at = at
at = at + n_dead

-- A redrive's dead letters (the exact entries it ran): all must still be
-- stored, or the redrive was beaten to them and nothing is written.
local n_taken = tonumber(take())
local taken_at = at
at = at + n_taken
for i = taken_at, taken_at + n_taken - 1 do
  if not redis.call('LPOS', KEYS[3], ARGV[i]) then
    return {'gone', ARGV[i]}
  end
end

-- 2. What would make a write fail: a key of another type, a counter that
-- holds no integer, a string that is no HyperLogLog.
for _ = 1, tonumber(take()) do
  local key = KEYS[tonumber(take())]
  local want = take()
  local field = take()
  local check = take()
  local found = redis.call('TYPE', key)['ok']
  if found ~= 'none' then
    if want ~= '' and found ~= want then
      return {'wrongtype', key, found, want}
    end
    if check == 'int' then
      local v
      if field == '' then
        v = redis.call('GET', key)
      else
        v = redis.call('HGET', key, field)
      end
      if v and not string.match(v, '^%-?%d+$') then
        return {'notinteger', key, field}
      end
    elseif check == 'hll' then
      if not pcall(redis.call, 'PFCOUNT', key) then
        return {'wrongtype', key, 'string (not a HyperLogLog)', 'hyperloglog'}
      end
    end
  end
end

-- 3. The writes: nothing below fails on what was checked above.
for i = 1, #moves, 2 do
  redis.call('HSET', KEYS[1], moves[i], moves[i + 1])
end
if lineage ~= '' then
  redis.call('RPUSH', KEYS[2], lineage)
  redis.call('LTRIM', KEYS[2], -keep, -1)
end
for i = taken_at, taken_at + n_taken - 1 do
  redis.call('LREM', KEYS[3], 1, ARGV[i])
end
for i = dead_at, dead_at + n_dead - 1 do
  redis.call('RPUSH', KEYS[3], ARGV[i])
end
if n_dead > 0 then
  redis.call('LTRIM', KEYS[3], -dead_keep, -1)
end
for _ = 1, tonumber(take()) do
  local op = take()
  local key = KEYS[tonumber(take())]
  local args = {}
  for i = 1, tonumber(take()) do
    args[i] = take()
  end
  if op == 'set' then
    -- value, ttl pairs: the last one is what stays
    local value, ttl = args[#args - 1], args[#args]
    if ttl == '' then
      redis.call('SET', key, value)
    else
      redis.call('SET', key, value, 'EX', ttl)
    end
  elseif op == 'hset' then
    redis.call('HSET', key, unpack(args))
  elseif op == 'hincrby' then
    for i = 1, #args, 2 do
      redis.call('HINCRBY', key, args[i], args[i + 1])
    end
  elseif op == 'incrby' then
    redis.call('INCRBY', key, args[1])
  elseif op == 'sadd' then
    redis.call('SADD', key, unpack(args))
  elseif op == 'pfadd' then
    redis.call('PFADD', key, unpack(args))
  elseif op == 'zadd' then
    redis.call('ZADD', key, unpack(args))
  elseif op == 'zincrby' then
    redis.call('ZINCRBY', key, args[1], args[2])
  elseif op == 'xadd' then
    redis.call('XADD', key, '*', unpack(args))
  elseif op == 'del' then
    redis.call('DEL', key)
  end
end

-- 4. Keyed state: per change a hash (checked above to be one, or absent),
-- set or delete, the state key and the stored value.
for _ = 1, tonumber(take()) do
  local key = KEYS[tonumber(take())]
  local op = take()
  local field = take()
  local value = take()
  if op == 's' then
    redis.call('HSET', key, field, value)
  else
    redis.call('HDEL', key, field)
  end
end
return {'ok'}
