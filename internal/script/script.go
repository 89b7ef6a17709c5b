// Package script runs shaper's Lua scripts: the shared prelude every script
// starts with (Redis's clock in microseconds, exact integer helpers) and one
// Run helper through which all scripts go, so errors read alike.
package script

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Prelude starts every shaper script. It defines:
//
//	shaper_now(override) -> now in integer µs from Redis TIME; override, when
//	                        non-empty, replaces it (tests, and hosts that forbid TIME)
//	shaper_int(n)        -> n as a decimal string without exponent, for SET
//	shaper_idiv(a, b)    -> ⌊a/b⌋, exact for non-negative integers below 2^53
//
// Lua 5.1 numbers are doubles: integers below 2^53 are exact, but tostring
// prints 1.7e+15, so values are stored through shaper_int.
const Prelude = `
local function shaper_now(override)
  if override ~= nil and override ~= '' then
    return tonumber(override)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function shaper_int(n)
  return string.format('%.0f', n)
end

local function shaper_idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end
`

// New builds a script from the prelude and the given Lua parts.
func New(parts ...string) *redis.Script {
	src := Prelude
	for _, p := range parts {
		src += p
	}
	return redis.NewScript(src)
}

// Lazy makes library parts into one loader, a function named name that
// defines their functions and returns those named by exports, in order. A
// function a script defines at its top level is a closure that Redis
// builds on every call of the script (some hundreds of instructions, more
// with upvalues); a library only some of a script's paths need is built,
// through its loader, only on those paths:
//
//	local forward_due, first_score   -- the script's, nil until loaded
//	...
//	if look then
//	  if not forward_due then forward_due, first_score = take_forward() end
//	  forward_due(...)
//	end
//
// The parts see the script's functions defined before the loader; the
// loader's functions are its own, whatever they are called.
func Lazy(name string, exports []string, parts ...string) string {
	var b strings.Builder
	b.WriteString("\nlocal function " + name + "()\n")
	for _, p := range parts {
		b.WriteString(p)
		b.WriteString("\n")
	}
	b.WriteString("return " + strings.Join(exports, ", ") + "\nend\n")
	return b.String()
}

// Run executes s by SHA, falling back to EVAL when Redis does not have it
// cached (go-redis's Script.Run does exactly this), and names the script in
// any error.
func Run(ctx context.Context, rdb redis.Scripter, name string, s *redis.Script, keys []string, args ...any) (any, error) {
	v, err := s.Run(ctx, rdb, keys, args...).Result()
	if err != nil {
		return nil, fmt.Errorf("script %s: %w", name, err)
	}
	return v, nil
}

// NowArg is the "now" argument for a script: empty (use Redis TIME) when
// clock is nil, else the clock's time in integer microseconds.
func NowArg(clock func() time.Time) string {
	if clock == nil {
		return ""
	}
	return strconv.FormatInt(clock().UnixMicro(), 10)
}

// Ints converts a script's array reply of integers.
func Ints(v any, want int) ([]int64, error) {
	arr, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("script reply %T, want an array", v)
	}
	if want >= 0 && len(arr) != want {
		return nil, fmt.Errorf("script reply has %d values, want %d", len(arr), want)
	}
	out := make([]int64, len(arr))
	for i, x := range arr {
		n, ok := x.(int64)
		if !ok {
			return nil, fmt.Errorf("script reply value %d is %T, want an integer", i, x)
		}
		out[i] = n
	}
	return out, nil
}
