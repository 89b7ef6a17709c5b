// Package gosdk drives shaper's proxy with the vendors' own Go SDKs,
// unchanged: github.com/openai/openai-go and github.com/stripe/stripe-go.
// It is a module of its own so that those SDKs stay out of shaper's go.mod;
// its tests build the shaper binary from this tree and run it as a user
// would.
package gosdk
