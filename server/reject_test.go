package server

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper/tokenbucket"
)

// series counts the time series reg holds.
func series(t *testing.T, reg *prometheus.Registry) int {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mf := range mfs {
		n += len(mf.GetMetric())
	}
	return n
}

// TestRejectedRequestsAddNoSeries: refused enqueues that name thousands of
// distinct upstreams leave the registry nearly as it was, since labels
// carry configured names only.
func TestRejectedRequestsAddNoSeries(t *testing.T) {
	if testing.Short() {
		t.Skip("seconds of requests: runs in make test")
	}
	// Admission is roomy, so every request below is judged, not refused 429.
	f := newFixture(t, tokenbucket.Limit{Capacity: 100000, Refill: 100000, Per: time.Second}, 1000)
	// Warm the registry with one of each kind of refusal, so the count
	// below measures growth with the number of distinct names, not the
	// first appearance of a reason.
	f.do("POST", "/v1/jobs", `{"upstream":"warm","path":"/x"}`)
	f.do("POST", "/v1/jobs", `{"upstream":"warm",`)
	before := series(t, f.reg)

	codes := map[int]int{}
	for i := 0; i < 1000; i++ {
		var body string
		switch i % 4 {
		case 0: // unknown upstream
			body = fmt.Sprintf(`{"upstream":"nope-%d","path":"/x"}`, i)
		case 1: // malformed JSON after the upstream
			body = fmt.Sprintf(`{"upstream":"nope-%d","path":`, i)
		case 2: // an unknown field after the upstream
			body = fmt.Sprintf(`{"upstream":"nope-%d","colour":"red"}`, i)
		case 3: // a wrong type after the upstream
			body = fmt.Sprintf(`{"upstream":"nope-%d","max_attempts":"x"}`, i)
		}
		resp, _ := f.do("POST", "/v1/jobs", body)
		codes[resp.StatusCode]++
	}
	if codes[400]+codes[404] != 1000 {
		t.Fatalf("single requests: got statuses %v, want 1000 of 400 or 404", codes)
	}
	items := map[float64]int{}
	for b := 0; b < 20; b++ {
		var jobs []string
		for j := 0; j < 50; j++ {
			n := b*50 + j
			if j%2 == 0 {
				jobs = append(jobs, fmt.Sprintf(`{"upstream":"batch-%d","path":"/x"}`, n))
			} else {
				jobs = append(jobs, fmt.Sprintf(`{"upstream":"batch-%d","colour":1}`, n))
			}
		}
		resp, body := f.do("POST", "/v1/jobs/batch", `{"jobs":[`+strings.Join(jobs, ",")+`]}`)
		if resp.StatusCode != 200 {
			t.Fatalf("batch %d: got %d %v, want 200", b, resp.StatusCode, body)
		}
		for _, r := range body["results"].([]any) {
			items[r.(map[string]any)["status"].(float64)]++
		}
	}
	if items[400]+items[404] != 1000 {
		t.Fatalf("batch items: got statuses %v, want 1000 of 400 or 404", items)
	}
	if after := series(t, f.reg); after-before > 20 {
		t.Fatalf("got %d series after 2,000 refused jobs (from %d), want at most 20 more", after, before)
	}
	if got := f.backlog(); got != 0 {
		t.Fatalf("backlog %d, want 0", got)
	}
	if n := counter(t, f.reg, "shaper_jobs_rejected_total", "unknown"); n < 1 {
		t.Fatalf("rejections under upstream=\"unknown\": got %v, want them counted", n)
	}
}

// TestInvalidRequestsPayAdmission: a key that sends only bad requests
// spends its allowance and meets 429, singly and in batches.
func TestInvalidRequestsPayAdmission(t *testing.T) {
	f := newFixture(t, tokenbucket.Limit{Capacity: 5, Refill: 1, Per: time.Hour}, 1000)
	var got []int
	for _, body := range []string{
		`{"upstream":`, `{"upstream":"twilio","path":"/x"}`, `{"upstream":"stripe"}`,
		`not json`, `{"upstream":"stripe","path":"/x","colour":1}`, `{"upstream":"stripe","path":"/x"}`,
	} {
		resp, _ := f.do("POST", "/v1/jobs", body)
		got = append(got, resp.StatusCode)
	}
	if want := []int{400, 404, 400, 400, 400, 429}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got statuses %v, want %v: five refusals spend the five tokens", got, want)
	}

	// A batch pays one token per item, the invalid ones included.
	f = newFixture(t, tokenbucket.Limit{Capacity: 5, Refill: 1, Per: time.Hour}, 1000)
	batch := `{"jobs":[{"upstream":"twilio","path":"/x"},{"upstream":"stripe"},{"upstream":"stripe","colour":1}]}`
	if resp, body := f.do("POST", "/v1/jobs/batch", batch); resp.StatusCode != 200 {
		t.Fatalf("first batch: got %d %v, want 200 with per-item errors", resp.StatusCode, body)
	}
	resp, body := f.do("POST", "/v1/jobs/batch", batch)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("second batch: got %d %v, want 429 with Retry-After (3 tokens asked, 2 left)", resp.StatusCode, body)
	}
	// A body that cannot be read at all still costs one.
	for i, want := range []int{400, 400, 429} {
		if resp, _ := f.do("POST", "/v1/jobs/batch", `{"jobs":`); resp.StatusCode != want {
			t.Fatalf("malformed batch %d: got %d, want %d", i, resp.StatusCode, want)
		}
	}
	if n := counter(t, f.reg, "shaper_admission_decisions_total", "denied"); n != 2 {
		t.Fatalf("denied decisions: got %v, want 2", n)
	}
	// Refused batches are counted per job, as single enqueues are.
	if n := sumCounter(t, f.reg, "shaper_jobs_rejected_total", "reason", "rate_limited"); n != 4 {
		t.Fatalf("rate_limited rejections: got %v, want 4 (3 items, 1 unreadable batch)", n)
	}
}

// sumCounter adds up the series of a counter whose label has the value.
func sumCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
