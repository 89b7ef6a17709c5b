package client

import (
	"net/http"
	"testing"
	"time"
)

func TestParseRateLimit(t *testing.T) {
	now := time.Unix(1691591363, 0).Add(-time.Minute)
	tests := []struct {
		name string
		h    http.Header
		want *RateLimit
	}{
		{"none", http.Header{"Retry-After": {"3"}}, nil},
		{
			"shaper's own answer",
			http.Header{
				"Ratelimit-Policy": {`"enqueue";q=10;w=10`}, "Ratelimit": {`"enqueue";r=0;t=4`},
				"X-Ratelimit-Limit": {"10"}, "X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {"4"},
			},
			&RateLimit{Policy: "enqueue", Limit: 10, Window: 10 * time.Second, Remaining: 0, Reset: 4 * time.Second},
		},
		{
			"the policy RateLimit names, not the first one",
			http.Header{
				"Ratelimit-Policy": {`"burst";q=100;w=60`, `"daily";q=1000;w=86400`},
				"Ratelimit":        {`"daily";r=7;t=3600`},
			},
			&RateLimit{Policy: "daily", Limit: 1000, Window: 24 * time.Hour, Remaining: 7, Reset: time.Hour},
		},
		{
			"a policy alone",
			http.Header{"Ratelimit-Policy": {`enqueue;q=5;w=1`}},
			&RateLimit{Policy: "enqueue", Limit: 5, Window: time.Second},
		},
		{
			"limit from X-RateLimit-Limit when no policy states it",
			http.Header{"Ratelimit": {`"enqueue";r=2;t=1`}, "X-Ratelimit-Limit": {"10"}, "X-Ratelimit-Remaining": {"2"}},
			&RateLimit{Policy: "enqueue", Limit: 10, Remaining: 2, Reset: time.Second},
		},
		{
			"malformed structured fields fall back to X-RateLimit-*",
			http.Header{
				"Ratelimit-Policy": {`"enqueue";q=10;w=10,`}, "Ratelimit": {`"enqueue";r=0;t=`},
				"X-Ratelimit-Limit": {"10"}, "X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1691591363"},
			},
			&RateLimit{Limit: 10, Remaining: 1, Reset: time.Minute},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := parseRateLimit(tt.h, now)
			if (got == nil) != (tt.want == nil) || (got != nil && *got != *tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}
