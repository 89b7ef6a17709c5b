package shaper_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

func TestCheckLimits(t *testing.T) {
	u := shaper.Upstream{Name: "openai", BaseURL: "https://api.openai.com",
		Limits:   []leaky.Limit{leaky.PerSecond(10), {Rate: 1000, Per: time.Minute, Cost: "tokens"}},
		Settle:   map[string]shaper.Settle{"tokens": {Header: "X-Tokens"}},
		Fairness: shaper.Fairness{By: shaper.FairByNone}}
	if err := u.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		limits []leaky.Limit
		want   []string // field: part of the message
	}{
		{"fine", []leaky.Limit{leaky.PerSecond(5), {Rate: 500, Per: time.Minute, Cost: "tokens"}}, nil},
		{"none", nil, []string{"limits: at least one limit", "limits: settle.tokens"}},
		{"rate 0", []leaky.Limit{{Rate: 0, Per: time.Second}, {Rate: 500, Per: time.Minute, Cost: "tokens"}}, []string{"limits[0]: rate 0"}},
		{"burst over rate", []leaky.Limit{{Rate: 5, Per: time.Second, Burst: 6}, {Rate: 500, Per: time.Minute, Cost: "tokens"}}, []string{"limits[0]: burst 6"}},
		{"bad cost name", []leaky.Limit{leaky.PerSecond(5), {Rate: 500, Per: time.Minute, Cost: "Tokens"}}, []string{"limits[1]: cost \"Tokens\"", "limits: settle.tokens"}},
		{"settled cost dropped", []leaky.Limit{leaky.PerSecond(5)}, []string{"limits: settle.tokens"}},
		{"window under the guard", []leaky.Limit{{Rate: 1, Per: 100 * time.Millisecond}, {Rate: 500, Per: time.Minute, Cost: "tokens"}}, []string{"limits[0].per: 100ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := u.CheckLimits(tc.limits)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %d problems like %v", got, len(tc.want), tc.want)
			}
			for i, p := range got {
				if !strings.HasPrefix(p.String(), tc.want[i]) {
					t.Errorf("problem %d: got %q, want it to start %q", i, p.String(), tc.want[i])
				}
			}
		})
	}
}

func TestCheckPartitionLimits(t *testing.T) {
	u := shaper.Upstream{Name: "mail", BaseURL: "https://mail.example", Limits: []leaky.Limit{leaky.PerSecond(100)}}
	for _, tc := range []struct {
		partition string
		limits    []leaky.Limit
		want      []string
	}{
		{"gmail.com", []leaky.Limit{{Rate: 1000, Per: time.Minute}}, nil},
		{"gmail.com", nil, []string{"limits: no limits"}},
		{"", []leaky.Limit{leaky.PerSecond(1)}, []string{"partition: not a valid partition"}},
		{"gmail.com", []leaky.Limit{{Rate: 10, Per: time.Second, Cost: "tokens"}}, []string{"limits[0].cost: \"tokens\""}},
		{"gmail.com", []leaky.Limit{{Rate: 10, Per: time.Second, Adaptive: true}}, []string{"limits[0].adaptive"}},
	} {
		got := u.CheckPartitionLimits(tc.partition, tc.limits)
		if len(got) != len(tc.want) {
			t.Errorf("%q %v: got %v, want %v", tc.partition, tc.limits, got, tc.want)
			continue
		}
		for i, p := range got {
			if !strings.HasPrefix(p.String(), tc.want[i]) {
				t.Errorf("%q %v: problem %d: got %q, want it to start %q", tc.partition, tc.limits, i, p.String(), tc.want[i])
			}
		}
	}
}
