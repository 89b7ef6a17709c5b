package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/shaperhq/shaper/fakeupstream"
)

func TestParseVmRSS(t *testing.T) {
	for _, c := range []struct {
		name, in string
		want     int64
		wantErr  bool
	}{
		{"status file", "Name:\tshaper\nVmPeak:\t  800000 kB\nVmRSS:\t   12345 kB\nRssAnon:\t 9000 kB\n", 12345 * 1024, false},
		{"last line without newline", "Name:\tx\nVmRSS:\t1 kB", 1024, false},
		{"VmHWM is not VmRSS", "VmHWM:\t   999 kB\nVmRSS:\t   7 kB\n", 7 * 1024, false},
		{"no line (a zombie)", "Name:\tx\nState:\tZ (zombie)\n", 0, true},
		{"other unit", "VmRSS:\t12 MB\n", 0, true},
		{"not a number", "VmRSS:\tlots kB\n", 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := parseVmRSS(c.in)
			if (err != nil) != c.wantErr {
				t.Fatalf("parseVmRSS: error %v, want error %v", err, c.wantErr)
			}
			if got != c.want {
				t.Errorf("parseVmRSS = %d, want %d", got, c.want)
			}
		})
	}
}

func TestRSSOfSelf(t *testing.T) {
	got, err := rssOf(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got < 1<<20 || got > 1<<34 {
		t.Errorf("own RSS = %d B, want between 1 MiB and 16 GiB", got)
	}
}

func mem(at time.Duration, used int64) sample { return sample{At: at, UsedMemory: used} }

func TestGrowth(t *testing.T) {
	flat := []sample{mem(30*time.Second, 5e6), mem(time.Minute, 9e6), mem(90*time.Second, 10e6), mem(2*time.Minute, 10.1e6), mem(3*time.Minute, 10e6)}
	rising := []sample{mem(time.Minute, 10e6), mem(2*time.Minute, 20e6), mem(3*time.Minute, 30e6), mem(4*time.Minute, 40e6)}
	for _, c := range []struct {
		name    string
		samples []sample
		from    time.Duration
		want    float64
		ok      bool
	}{
		{"plateau", flat, 90 * time.Second, 0, true},
		{"takes the first sample at or after from", flat, 80 * time.Second, 0, true},
		{"steady growth", rising, 2 * time.Minute, 100, true},
		{"from past the last sample: the last", rising, time.Hour, 0, true},
		{"before the first: the first", rising, 0, 300, true},
		{"no samples", nil, time.Minute, 0, false},
		{"no memory read", []sample{mem(time.Minute, 0), mem(2*time.Minute, 5)}, 0, 0, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := growth(c.samples, c.from)
			if ok != c.ok || got != c.want {
				t.Errorf("growth = %.2f%%, %v; want %.2f%%, %v", got, ok, c.want, c.ok)
			}
		})
	}
}

func TestPlateauFrom(t *testing.T) {
	for _, c := range []struct{ d, want time.Duration }{
		{30 * time.Minute, 5 * time.Minute},
		{10 * time.Minute, 5 * time.Minute},
		{3 * time.Minute, 90 * time.Second},
	} {
		if got := plateauFrom(c.d); got != c.want {
			t.Errorf("plateauFrom(%v) = %v, want %v", c.d, got, c.want)
		}
	}
}

func TestMaxRSS(t *testing.T) {
	ss := []sample{
		{ServeRSS: 30, WorkerRSS: []int64{10, 40, 0}, RedisRSS: 7, SelfRSS: 3},
		{ServeRSS: 20, WorkerRSS: []int64{50, 1, 2}, RedisRSS: 9, SelfRSS: 1},
	}
	serve, worker, redisRSS, self := maxRSS(ss)
	if serve != 30 || worker != 50 || redisRSS != 9 || self != 3 {
		t.Errorf("maxRSS = %d, %d, %d, %d; want 30, 50, 9, 3", serve, worker, redisRSS, self)
	}
}

func TestPlateauBy(t *testing.T) {
	// 6,000 kept at 200/s push a job out after 30 s, before its minute
	// of retention; then two minutes and a twelfth of records.
	o := options{rate: 200, keep: 6000, retention: time.Minute, idemWindow: 2 * time.Minute}
	if got, want := plateauBy(o), 30*time.Second+2*time.Minute+10*time.Second; got != want {
		t.Errorf("plateauBy = %v, want %v", got, want)
	}
}

func TestJobBody(t *testing.T) {
	var job struct {
		Upstream       string `json:"upstream"`
		Body           string `json:"body"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	if err := json.Unmarshal(jobBody("r1", 42), &job); err != nil {
		t.Fatal(err)
	}
	if job.Upstream != "api" || job.IdempotencyKey != "soak-r1-42" {
		t.Errorf("job = %+v, want upstream api, idempotency key soak-r1-42", job)
	}
	if n := len(job.Body); n < 90 || n > 110 {
		t.Errorf("body is %d bytes, want about 100: %s", n, job.Body)
	}
	if !json.Valid([]byte(job.Body)) {
		t.Errorf("body is not JSON: %s", job.Body)
	}
}

// The fake's own answers pass through, except that a 200 carries the
// small body, whole and valid, and a 429 stays a 429.
func TestUpstreamAnswers(t *testing.T) {
	up, err := startUpstream(fakeupstream.Config{Rate: 1, Per: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer up.close()
	get := func() (int, []byte) {
		resp, err := http.Post(up.url+"/v1/orders", "application/json", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	status, body := get()
	if status != http.StatusOK || len(body) != 50 || !json.Valid(body) {
		t.Errorf("first answer: %d %q (%d bytes), want 200 with 50 bytes of JSON", status, body, len(body))
	}
	status, body = get()
	if status != http.StatusTooManyRequests {
		t.Errorf("second answer within the limit's hour: %d %q, want 429", status, body)
	}
	if rep := up.fake.Report(); rep.Rejected != 1 || rep.ByStatus[http.StatusOK] != 1 {
		t.Errorf("upstream counted %d 429s and %d 200s, want 1 and 1", rep.Rejected, rep.ByStatus[http.StatusOK])
	}
}

func TestRefusalsIn(t *testing.T) {
	ms := time.Millisecond
	rec := func(seq uint64, at time.Duration, status int) fakeupstream.Record {
		return fakeupstream.Record{Seq: seq, At: at, Status: status, Admitted: status != http.StatusTooManyRequests}
	}
	recs := []fakeupstream.Record{
		rec(0, 100*ms, 200), rec(1, 900*ms, 200), rec(2, 1050*ms, 200), rec(3, 1100*ms, 429),
		rec(4, 1200*ms, 200), rec(5, 2500*ms, 429),
	}
	found, last := refusalsIn(recs, -1, 50*ms)
	want := []refusal{{At: 1050 * ms, InSecond: 3, Admitted: 2}, {At: 2450 * ms, InSecond: 1, Admitted: 0}}
	if last != 5 || len(found) != len(want) {
		t.Fatalf("refusalsIn = %+v, last %d; want %+v, last 5", found, last, want)
	}
	for i := range want {
		if found[i] != want[i] {
			t.Errorf("refusal %d = %+v, want %+v", i, found[i], want[i])
		}
	}
	// Those already reported are not found again.
	if found, last := refusalsIn(recs, 3, 0); len(found) != 1 || found[0].At != 2500*ms || last != 5 {
		t.Errorf("after seq 3: %+v, last %d; want the one at 2.5s, last 5", found, last)
	}
	if found, last := refusalsIn(recs, 5, 0); len(found) != 0 || last != 5 {
		t.Errorf("after seq 5: %+v, last %d; want none, last 5", found, last)
	}
}
