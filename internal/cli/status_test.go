package cli

import (
	"testing"
	"time"

	"github.com/shaperhq/shaper/status"
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

func TestPartitionsLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    status.Partitions
		want string
	}{
		{"none", status.Partitions{Top: []status.PartitionBacklog{}}, ""},
		{"all shown", status.Partitions{WithBacklog: 2, Top: []status.PartitionBacklog{{Partition: "a.example", Backlog: 150}, {Partition: "b.example", Backlog: 3}}},
			"partitions with backlog: 2 (top: a.example 150, b.example 3)"},
		{"more than the top", status.Partitions{WithBacklog: 40, Top: []status.PartitionBacklog{{Partition: "a.example", Backlog: 150}, {Partition: "b.example", Backlog: 3}}},
			"partitions with backlog: 40 (top: a.example 150, b.example 3, …)"},
		{"ambiguous names quoted", status.Partitions{WithBacklog: 2, Top: []status.PartitionBacklog{{Partition: "acme, inc", Backlog: 7}, {Partition: "x y", Backlog: 1}}},
			`partitions with backlog: 2 (top: "acme, inc" 7, "x y" 1)`},
		{"no top listed", status.Partitions{WithBacklog: 5}, "partitions with backlog: 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := partitionsLine(tc.p); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
