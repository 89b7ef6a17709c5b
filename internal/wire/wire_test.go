package wire

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 30, 8, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in     string
		want   time.Duration
		wantOK bool
	}{
		{"", 0, false},
		{"  ", 0, false},
		{"0", 0, true},
		{"7", 7 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"1.5", 1500 * time.Millisecond, true},
		{"-1", 0, false},
		{"-0.5", 0, false},
		{"NaN", 0, false},
		{"soon", 0, false},
		// Too big for int64: read as a number and capped, not overflowed.
		{"99999999999999999999", time.Duration(float64(maxRetryAfterSeconds) * float64(time.Second)), true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		got, ok := ParseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.wantOK {
			t.Errorf("ParseRetryAfter(%q): got %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestAPIKey(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    string
		wantErr error
	}{
		{"bearer", map[string]string{"Authorization": "Bearer k1"}, "k1", nil},
		{"scheme in any case, spaces trimmed", map[string]string{"Authorization": "bearer   k1 "}, "k1", nil},
		{"x-api-key", map[string]string{"X-API-Key": " k2 "}, "k2", nil},
		{"bearer wins", map[string]string{"Authorization": "Bearer k1", "X-API-Key": "k2"}, "k1", nil},
		{"neither", nil, "", nil},
		{"basic is not a key", map[string]string{"Authorization": "Basic dXNlcjpwdw==", "X-API-Key": "k2"}, "", ErrNotBearer},
		{"bearer without a key", map[string]string{"Authorization": "Bearer"}, "", ErrNotBearer},
		{"bearer with spaces only", map[string]string{"Authorization": "Bearer   "}, "", ErrNotBearer},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		for k, v := range tc.headers {
			r.Header.Set(k, v)
		}
		got, err := APIKey(r)
		if got != tc.want || !errors.Is(err, tc.wantErr) {
			t.Errorf("%s: got %q, %v; want %q, %v", tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestWriteProblem(t *testing.T) {
	w := httptest.NewRecorder()
	WriteProblem(w, Problem{Type: TypeBacklogFull, Title: "Backlog full", Status: 503, RetryAfter: 7,
		Errors: []FieldError{{Field: "upstream", Message: "is full"}}})
	if w.Code != 503 || w.Header().Get("Content-Type") != ContentTypeProblem || w.Header().Get("Retry-After") != "7" {
		t.Fatalf("got %d %v, want 503 problem+json with Retry-After 7", w.Code, w.Header())
	}
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p.RetryAfter != 7 || p.Type != TypeBacklogFull || len(p.Errors) != 1 {
		t.Fatalf("got body %q (%v), want the problem back", w.Body, err)
	}
	if got, want := w.Header().Get("Content-Length"), strconv.Itoa(w.Body.Len()); got != want {
		t.Errorf("got Content-Length %s, want %s", got, want)
	}
	// A Retry-After the caller set (say, from rate-limit headers) stays.
	w = httptest.NewRecorder()
	w.Header().Set("Retry-After", "3")
	WriteProblem(w, Problem{Type: TypeRateLimited, Title: "Rate limit exceeded", Status: 429, RetryAfter: 5})
	if got := w.Header().Get("Retry-After"); got != "3" {
		t.Errorf("got Retry-After %q, want the caller's 3", got)
	}
}
