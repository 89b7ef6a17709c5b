// Package keyspace owns the one rule every Redis key shaper itself writes
// follows: it starts with a prefix, "shaper" unless the deployment
// configures another. Each package builds its own keys under that prefix
// with a hash tag of its own; this package only says what the prefix is
// when none is given. (asynq's queue keys are asynq's and do not take the
// prefix; see package queue.)
package keyspace

// DefaultPrefix starts every key when no prefix is configured.
const DefaultPrefix = "shaper"

// Prefix is p, or DefaultPrefix when p is empty.
func Prefix(p string) string {
	if p == "" {
		return DefaultPrefix
	}
	return p
}
