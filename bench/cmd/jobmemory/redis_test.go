package main

import (
	"slices"
	"testing"
)

func TestDBKeys(t *testing.T) {
	for _, tc := range []struct {
		line    string
		want    int64
		wantErr bool
	}{
		{"keys=20012,expires=3,avg_ttl=3599000", 20012, false},
		{"expires=0,keys=7,avg_ttl=0", 7, false},
		{"", 0, false},
		{"expires=0,avg_ttl=0", 0, true},
		{"keys=x,expires=0", 0, true},
	} {
		got, err := dbKeys(tc.line)
		if (err != nil) != tc.wantErr || got != tc.want {
			t.Errorf("dbKeys(%q) = %d, %v; want %d, error %v", tc.line, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestDiff(t *testing.T) {
	before := snapshot{"same": 100, "grew": 200, "gone": 50}
	after := snapshot{"same": 100, "grew": 336, "new": 880}
	got := diff(before, after)
	want := []change{{"gone", 50, -1}, {"grew", 200, 336}, {"new", -1, 880}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	var sum int64
	for _, c := range got {
		sum += c.Delta()
	}
	if sum != -50+136+880 {
		t.Errorf("got deltas summing to %d, want %d", sum, -50+136+880)
	}
}
