package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// SourceOperator is the Limit.Source of a limit an operator set in place
// of the configured ones (SetLimits).
const SourceOperator = "operator"

// LimitSpec is a limit to put in force, as the config's limits give one.
type LimitSpec struct {
	// Rate is the most units in any window of length Per.
	Rate int64
	Per  time.Duration
	// Cost names the amount counted, e.g. "tokens"; empty counts requests.
	Cost  string
	Burst int64
	// Adaptive makes Rate a ceiling (upstream limits on requests only).
	Adaptive bool
}

// MarshalJSON writes per as a Go duration, as the server reads it.
func (l LimitSpec) MarshalJSON() ([]byte, error) {
	return json.Marshal(struct {
		Rate     int64  `json:"rate"`
		Per      string `json:"per"`
		Cost     string `json:"cost,omitempty"`
		Burst    int64  `json:"burst,omitempty"`
		Adaptive bool   `json:"adaptive,omitempty"`
	}{l.Rate, l.Per.String(), l.Cost, l.Burst, l.Adaptive})
}

// LimitsOverride is set on an UpstreamStatus while an operator's limits
// replace the configured ones.
type LimitsOverride struct {
	Since            time.Time `json:"since"`
	ConfiguredLimits []Limit   `json:"configured_limits"`
}

// PartitionLimits are the limits one partition is held to beside its
// upstream's: Source is SourceOperator, SourceConfigured, or empty when it
// has none.
type PartitionLimits struct {
	Upstream  string  `json:"upstream"`
	Partition string  `json:"partition"`
	Limits    []Limit `json:"limits"`
	Source    string  `json:"source,omitempty"`
}

type limitsBody struct {
	Limits []LimitSpec `json:"limits"`
}

// SetLimits replaces the upstream's limits for every replica, within a
// second and until ResetLimits, and returns its status. It needs an admin
// key. Limits the server finds wrong change nothing: the *Error's Fields
// name them.
func (c *Client) SetLimits(ctx context.Context, upstream string, limits []LimitSpec) (*UpstreamStatus, error) {
	if upstream == "" {
		return nil, errors.New("set limits: empty upstream name")
	}
	var st UpstreamStatus
	if _, err := c.do(ctx, http.MethodPut, "/v1/upstreams/"+pathSegment(upstream)+"/limits", limitsBody{Limits: limits}, &st); err != nil {
		return nil, fmt.Errorf("set limits of %s: %w", upstream, err)
	}
	return &st, nil
}

// ResetLimits puts the upstream's configured limits back in force and
// returns its status. It needs an admin key.
func (c *Client) ResetLimits(ctx context.Context, upstream string) (*UpstreamStatus, error) {
	if upstream == "" {
		return nil, errors.New("reset limits: empty upstream name")
	}
	var st UpstreamStatus
	if _, err := c.do(ctx, http.MethodDelete, "/v1/upstreams/"+pathSegment(upstream)+"/limits", nil, &st); err != nil {
		return nil, fmt.Errorf("reset limits of %s: %w", upstream, err)
	}
	return &st, nil
}

func partitionLimitsPath(upstream, partition string) string {
	return "/v1/upstreams/" + pathSegment(upstream) + "/partitions/" + pathSegment(partition) + "/limits"
}

// PartitionLimits reads the limits a partition is held to.
func (c *Client) PartitionLimits(ctx context.Context, upstream, partition string) (*PartitionLimits, error) {
	var out PartitionLimits
	if _, err := c.do(ctx, http.MethodGet, partitionLimitsPath(upstream, partition), nil, &out); err != nil {
		return nil, fmt.Errorf("limits of %s partition %s: %w", upstream, partition, err)
	}
	return &out, nil
}

// SetPartitionLimits gives one partition limits of its own in place of
// what the config gives it, until ResetPartitionLimits. It needs an admin
// key.
func (c *Client) SetPartitionLimits(ctx context.Context, upstream, partition string, limits []LimitSpec) (*PartitionLimits, error) {
	if upstream == "" || partition == "" {
		return nil, errors.New("set partition limits: empty upstream or partition")
	}
	var out PartitionLimits
	if _, err := c.do(ctx, http.MethodPut, partitionLimitsPath(upstream, partition), limitsBody{Limits: limits}, &out); err != nil {
		return nil, fmt.Errorf("set limits of %s partition %s: %w", upstream, partition, err)
	}
	return &out, nil
}

// ResetPartitionLimits gives the partition back what the config gives it.
// It needs an admin key.
func (c *Client) ResetPartitionLimits(ctx context.Context, upstream, partition string) (*PartitionLimits, error) {
	if upstream == "" || partition == "" {
		return nil, errors.New("reset partition limits: empty upstream or partition")
	}
	var out PartitionLimits
	if _, err := c.do(ctx, http.MethodDelete, partitionLimitsPath(upstream, partition), nil, &out); err != nil {
		return nil, fmt.Errorf("reset limits of %s partition %s: %w", upstream, partition, err)
	}
	return &out, nil
}
