package main

import (
	"bytes"
	"slices"
	"testing"
	"time"
)

// The parent learns everything about a run from what replicas print, so
// what one prints must read back the same.
func TestReplicaReportRoundTrip(t *testing.T) {
	in := &replicaReport{
		sends:    []time.Time{time.Unix(0, 1_700_000_000_000_000_001), time.Unix(0, 1_700_000_000_005_000_000)},
		lateness: []time.Duration{1234 * time.Microsecond, -3},
		late:     2,
		refused:  1,
	}
	var buf bytes.Buffer
	if err := in.write(&buf); err != nil {
		t.Fatal(err)
	}
	out, err := parseReplicaReport(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(out.sends, in.sends, time.Time.Equal) || !slices.Equal(out.lateness, in.lateness) ||
		out.late != in.late || out.refused != in.refused {
		t.Errorf("got %+v, want %+v", out, in)
	}
	if _, err := parseReplicaReport([]byte("send 1\n")); err == nil {
		t.Errorf("got no error for a malformed line, want one")
	}
}

func TestReplicaOptionsRoundTrip(t *testing.T) {
	in := replicaOptions{
		limiter: limiterShaper, redis: "127.0.0.1:6379", bucket: "b", rate: 2000, per: time.Second, workers: 8,
		start: time.Unix(0, 1_700_000_000_000_000_000), end: time.Unix(0, 1_700_000_010_000_000_000),
	}
	out, err := parseReplicaFlags(in.args())
	if err != nil {
		t.Fatal(err)
	}
	if out != in {
		t.Errorf("got %+v, want %+v", out, in)
	}
}
