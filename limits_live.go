package shaper

import (
	"fmt"
	"slices"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

// CheckLimits says what is wrong with limits an operator would put in
// place of the upstream's own (PUT /v1/upstreams/{name}/limits), as a
// config file giving them would be told: each problem the upstream has
// with them and does not have as configured. Paths start at "limits", as
// the request names them; a problem they cause elsewhere (a cost that
// settle names but no limit counts any more) is told under "limits" too.
func (u Upstream) CheckLimits(limits []leaky.Limit) []Problem {
	v := u
	v.Limits = limits
	return newProblems(u, v, func(p []any) []any { return p }, limits, u.WithDefaults().Guard)
}

// CheckPartitionLimits is CheckLimits for one partition's own limits
// (PUT /v1/upstreams/{name}/partitions/{partition}/limits), checked as a
// partition_overrides entry is; paths start at "limits" too, and a bad
// partition is told under "partition".
func (u Upstream) CheckPartitionLimits(partition string, limits []leaky.Limit) []Problem {
	if err := CheckPartition(partition); err != nil {
		return []Problem{{Path: []any{"partition"}, Msg: fmt.Sprintf("not a valid partition: %v", err)}}
	}
	v := u
	v.PartitionOverrides = map[string][]leaky.Limit{partition: limits}
	if limits == nil {
		// An empty list, so that it is told as one.
		v.PartitionOverrides[partition] = []leaky.Limit{}
	}
	// The config's own overrides are not in question here.
	base := u
	base.PartitionOverrides = nil
	under := []any{"partition_overrides", partition}
	return newProblems(base, v, func(p []any) []any {
		if len(p) >= 2 && p[0] == under[0] && p[1] == under[1] {
			return append([]any{"limits"}, p[2:]...)
		}
		return p
	}, limits, u.WithDefaults().Guard)
}

// newProblems lists v's problems that base does not have, with paths
// moved by at (anything outside "limits" moved under it).
func newProblems(base, v Upstream, at func([]any) []any, limits []leaky.Limit, guard time.Duration) []Problem {
	had := map[string]bool{}
	for _, p := range base.Problems().List {
		had[p.String()] = true
	}
	var out []Problem
	for _, p := range v.Problems().List {
		if had[p.String()] {
			continue
		}
		path := at(p.Path)
		if len(path) == 0 || path[0] != "limits" {
			path, p.Msg = []any{"limits"}, p.String()
		}
		out = append(out, Problem{Path: path, Msg: p.Msg})
	}
	// The guard stays the config's: a window too short for it would be
	// paced far below its rate.
	for i, l := range limits {
		if l.Per > 0 && l.Per < 10*guard && !slices.ContainsFunc(out, func(p Problem) bool { return len(p.Path) > 1 && p.Path[1] == i }) {
			out = append(out, Problem{Path: []any{"limits", i, "per"},
				Msg: fmt.Sprintf("%v: must be at least 10 times the upstream's guard (%v)", l.Per, guard)})
		}
	}
	return out
}
