package stats

import "testing"

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	in := []float64{2, 1}
	Median(in)
	if in[0] != 2 {
		t.Error("Median sorted its argument")
	}
}

func TestCounts(t *testing.T) {
	got, err := Counts("1, 8,64")
	if err != nil || len(got) != 3 || got[2] != 64 {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "1,x", "-2"} {
		if _, err := Counts(bad); err == nil {
			t.Errorf("Counts(%q) accepted", bad)
		}
	}
}
