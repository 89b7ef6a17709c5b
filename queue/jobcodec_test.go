package queue

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestJobCodecRoundTrips(t *testing.T) {
	at := time.Date(2026, 11, 30, 17, 36, 20, 452799984, time.UTC)
	full := Job{
		ID: "stripe.default.d012a579-2ywwndralooq4oyxmgnylu6u", Tenant: "t", Upstream: "stripe", Lane: "default",
		Partition: "gmail.com", Method: "POST", Path: "/v1/charges/1", Headers: map[string]string{"Content-Type": "application/json"},
		Body: []byte(`{"amount":100,"note":"<&>"}`), Secrets: "0a1b", Cost: map[string]int64{"tokens": 40},
		IdempotencyKey: "order-7", MaxAttempts: 3, NotBefore: at.Add(time.Second), ExpiresAt: at.Add(time.Hour),
		CreatedAt: at, RetriedAt: at.Add(time.Minute), Retries: 2, PreviousError: "upstream answered 500",
	}
	binary := full
	binary.Body = []byte{0xff, 0x00, 0xfe, 'a'}
	bare := Job{ID: "api.default.00000001-abc", Upstream: "api", Lane: "default", Task: "report", CreatedAt: at}
	bare.IdempotencyKey = bare.ID
	for name, j := range map[string]Job{"full": full, "binary body": binary, "bare": bare} {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeJob(&j)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeJob(j.ID, b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if !reflect.DeepEqual(got, j) {
				t.Errorf("round trip of %s:\ngot  %+v\nwant %+v", b, got, j)
			}
		})
	}
}

// Only the stored form reads: a payload of another version, a cut one, or
// the Job's API JSON (which has no "v") is an error, not a job with
// fields missing.
func TestDecodeJobRefusesOtherForms(t *testing.T) {
	api, _ := json.Marshal(&Job{ID: "stripe.default.x", Upstream: "stripe", Method: "POST", Path: "/p", MaxAttempts: 3})
	for name, payload := range map[string]string{
		"unknown version": `{"v":3}`,
		"no version":      `{"u":"stripe","p":"/p"}`,
		"api json":        string(api),
		"cut":             `{"v":2,`,
		"not json":        "stripe",
	} {
		if j, err := DecodeJob("stripe.default.x", []byte(payload)); err == nil {
			t.Errorf("%s %s: got %+v, want an error", name, payload, j)
		}
	}
}

// The stored form is what issue 12 asked for: no ID, no idempotency key
// that is the ID, a UTF-8 body as itself rather than base64.
func TestEncodeJobIsCompact(t *testing.T) {
	body := strings.Repeat("b", 100)
	j := Job{ID: "stripe.default.d012a579-2ywwndralooq4oyxmgnylu6u", Tenant: "t", Upstream: "stripe", Lane: "default",
		Method: "POST", Path: "/v1/charges/1", Headers: map[string]string{"Content-Type": "application/json"},
		Body: []byte(body), MaxAttempts: 3, CreatedAt: time.Now().UTC()}
	j.IdempotencyKey = j.ID
	b, err := EncodeJob(&j)
	if err != nil {
		t.Fatal(err)
	}
	api, _ := json.Marshal(&j)
	t.Logf("stored %d B (the API JSON: %d B): %s", len(b), len(api), b)
	if bytes.Contains(b, []byte(j.ID)) {
		t.Errorf("stored form %s holds the ID", b)
	}
	if !bytes.Contains(b, []byte(body)) {
		t.Errorf("stored form %s does not hold the body as itself", b)
	}
	if len(b) > len(body)+160 {
		t.Errorf("stored form is %d B for a %d-byte body, want at most body + 160", len(b), len(body))
	}
}

func TestResponseCodecRoundTrips(t *testing.T) {
	for name, r := range map[string]Response{
		"json":      {Status: 200, Headers: map[string][]string{"Content-Type": {"application/json"}, "X-A": {"1", "2"}}, Body: []byte(`{"ok":true,"html":"<b>&"}`)},
		"binary":    {Status: 502, Body: []byte{0xff, 0, 1}, Truncated: true},
		"no body":   {Status: 204},
		"empty map": {Status: 200, Headers: map[string][]string{}},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := EncodeResponse(&r)
			if err != nil {
				t.Fatal(err)
			}
			got, err := DecodeResponse(b)
			if err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if len(r.Headers) == 0 {
				r.Headers = nil
			}
			if !reflect.DeepEqual(got, r) {
				t.Errorf("round trip of %s:\ngot  %+v\nwant %+v", b, got, r)
			}
		})
	}
	api, _ := json.Marshal(&Response{Status: 201, Body: []byte("made")})
	for _, b := range []string{`{"v":9,"s":200}`, string(api), `{"v":2,"s":`} {
		if got, err := DecodeResponse([]byte(b)); err == nil {
			t.Errorf("DecodeResponse(%s): got %+v, want an error", b, got)
		}
	}
}

// Times nanoseconds cannot hold (before 1678, after 2262) keep their
// meaning: a not_before long past stays past, a far expiry stays far.
func TestJobCodecClampsFarTimes(t *testing.T) {
	j := Job{ID: "api.default.x", Upstream: "api", NotBefore: time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC),
		ExpiresAt: time.Now().Add(2100000 * time.Hour), CreatedAt: time.Now().UTC()}
	b, err := EncodeJob(&j)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeJob(j.ID, b)
	if err != nil {
		t.Fatal(err)
	}
	if got.NotBefore.IsZero() || got.NotBefore.Year() > 1700 {
		t.Errorf("not_before in 1600: got %v, want a time long past", got.NotBefore)
	}
	if got.ExpiresAt.Year() < 2200 {
		t.Errorf("an expiry in %d: got %v, want one centuries ahead", j.ExpiresAt.Year(), got.ExpiresAt)
	}
}
