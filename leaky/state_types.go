package leaky

// This file stands in for the lead's leaky/dynamic.go (issue 9) on the
// h-surface branch, so that status can be written against State.Limits;
// the definitions are copied from it exactly. Delete this file when
// merging: dynamic.go declares the same names.

// LimitState is one limit as the bucket paces it now.
type LimitState struct {
	// Limit is as configured; for a stated limit, Rate and Per are the
	// upstream's quota and window.
	Limit Limit
	// Rate is the rate paced at now, in units per Limit.Per: Limit.Rate
	// unless an adaptive limit is below its ceiling.
	Rate float64
	// Source is "configured", "adaptive" or "stated".
	Source string
}

// Sources of a LimitState.
const (
	SourceConfigured = "configured"
	SourceAdaptive   = "adaptive"
	SourceStated     = "stated"
)
