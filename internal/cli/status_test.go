package cli

import (
	"testing"
	"time"
)

func TestHumanDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{850400 * time.Microsecond, "850ms"},
		{12400 * time.Millisecond, "12s"},
		{200 * time.Second, "3m20s"},
		{59*time.Minute + 59600*time.Millisecond, "1h0m"},
		{2*time.Hour + 5*time.Minute + 10*time.Second, "2h5m"},
		{1000 * time.Hour, "42d"},
	} {
		if got := humanDuration(tc.d); got != tc.want {
			t.Errorf("humanDuration(%v): got %q, want %q", tc.d, got, tc.want)
		}
	}
}
