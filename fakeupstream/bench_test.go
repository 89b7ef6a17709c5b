package fakeupstream

import (
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkServeHTTP measures the handler alone at a high limit, so that
// the fake upstream is never the bottleneck of a pacing benchmark.
func BenchmarkServeHTTP(b *testing.B) {
	for _, alg := range []Algorithm{SlidingLog, FixedWindow, TokenBucket} {
		b.Run(string(alg), func(b *testing.B) {
			clock := &fakeClock{t: epoch}
			s, err := New(Config{Algorithm: alg, Rate: 5000, Style: StyleOpenAI, Now: clock.Now})
			if err != nil {
				b.Fatal(err)
			}
			r := httptest.NewRequest("POST", "/v1/chat/completions", nil)
			r.Header.Set("Authorization", "Bearer k")
			r.Header.Set("Idempotency-Key", "abc")
			for b.Loop() {
				clock.Advance(200 * time.Microsecond) // 5,000/s: always admitted
				s.ServeHTTP(httptest.NewRecorder(), r)
			}
		})
	}
}
