package gcra

// LuaFunctions is the Lua twin of this package, for every script that keeps
// a TAT. It needs script.Prelude before it (for shaper_idiv) and defines:
//
//	gcra_earliest(tat, now, interval, capacity, cost)
//	gcra_take(tat, at, interval, cost)
//	gcra_remaining(tat, now, interval, capacity)
//
// Every value is an integer below 2^53, so the double arithmetic of Lua 5.1
// is exact and matches the Go functions bit for bit.
const LuaFunctions = `

local function gcra_earliest(tat, now, interval, capacity, cost)
  if tat < now then tat = now end
  local at = tat - (capacity - cost) * interval
  if at < now then return now end
  return at
end

local function gcra_take(tat, at, interval, cost)
  if tat < at then tat = at end
  return tat + cost * interval
end

local function gcra_remaining(tat, now, interval, capacity)
  local level = tat - now
  if level < 0 then level = 0 end
  local free = capacity * interval - level
  if free <= 0 then return 0 end
  return shaper_idiv(free, interval)
end
`
