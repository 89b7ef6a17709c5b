package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/leaky"
)

func TestParseLimitFlag(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want leaky.Limit
		err  string
	}{
		{"100/1s", leaky.Limit{Rate: 100, Per: time.Second}, ""},
		{"400000/1m,cost=tokens,burst=8000", leaky.Limit{Rate: 400000, Per: time.Minute, Cost: "tokens", Burst: 8000}, ""},
		{"50/1s,adaptive", leaky.Limit{Rate: 50, Per: time.Second, Adaptive: true}, ""},
		{"100", leaky.Limit{}, "want RATE/PER"},
		{"x/1s", leaky.Limit{}, "not a whole number"},
		{"10/soon", leaky.Limit{}, "not a duration"},
		{"10/1s,speed=3", leaky.Limit{}, "unknown"},
	} {
		got, err := parseLimitFlag(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: got error %v, want one saying %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("%q: got %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}
