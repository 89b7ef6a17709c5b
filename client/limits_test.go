package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shaperhq/shaper/client"
)

func TestSetAndResetLimits(t *testing.T) {
	f := newFake()
	defer f.Close()
	c, _ := newClient(t, f, adminKey)
	ctx := context.Background()
	st, err := c.SetLimits(ctx, "stripe", []client.LimitSpec{{Rate: 50, Per: time.Second}, {Rate: 400000, Per: time.Minute, Cost: "tokens", Burst: 100}})
	if err != nil {
		t.Fatal(err)
	}
	log := f.log()
	r := log[len(log)-1]
	want := `{"limits":[{"rate":50,"per":"1s"},{"rate":400000,"per":"1m0s","cost":"tokens","burst":100}]}`
	if r.Method != "PUT" || r.Path != "/v1/upstreams/stripe/limits" || string(r.Body) != want {
		t.Errorf("SetLimits: got %s %s %s, want PUT /v1/upstreams/stripe/limits %s", r.Method, r.Path, r.Body, want)
	}
	if st.Override == nil || len(st.Limits) != 2 || st.Limits[0].Source != client.SourceOperator || st.Limits[0].Per != time.Second {
		t.Errorf("SetLimits: got status %+v (override %+v), want the operator's limits", st.Limits, st.Override)
	}
	_, err = c.SetLimits(ctx, "stripe", []client.LimitSpec{{Rate: 0, Per: time.Second}})
	var apiErr *client.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != 400 || len(apiErr.Fields) != 1 || apiErr.Fields[0].Field != "limits[0]" {
		t.Errorf("SetLimits rate 0: got %v, want a 400 naming limits[0]", err)
	}
	if st, err = c.ResetLimits(ctx, "stripe"); err != nil || st.Override != nil {
		t.Errorf("ResetLimits: got %+v, %v; want no override", st, err)
	}
	if r := f.log()[len(f.log())-1]; r.Method != "DELETE" || r.Path != "/v1/upstreams/stripe/limits" {
		t.Errorf("ResetLimits: got %s %s", r.Method, r.Path)
	}
	pl, err := c.SetPartitionLimits(ctx, "stripe", "acme/eu", []client.LimitSpec{{Rate: 10, Per: time.Minute}})
	if err != nil || pl.Source != client.SourceOperator || pl.Partition != "acme/eu" || len(pl.Limits) != 1 {
		t.Fatalf("SetPartitionLimits: got %+v, %v", pl, err)
	}
	if pl, err = c.ResetPartitionLimits(ctx, "stripe", "acme/eu"); err != nil || pl.Source != "" {
		t.Errorf("ResetPartitionLimits: got %+v, %v", pl, err)
	}
	user, _ := newClient(t, f, producerKey)
	if _, err := user.SetLimits(ctx, "stripe", []client.LimitSpec{{Rate: 5, Per: time.Second}}); !errors.As(err, &apiErr) || apiErr.StatusCode != 403 {
		t.Errorf("SetLimits with a producer key: got %v, want 403", err)
	}
}
