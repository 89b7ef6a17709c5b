package shaper

import (
	"net/http"
	"strings"
	"testing"
)

// TestEventSettler reads events split at every byte, with every line end
// the standard allows, and skips what is not JSON with the path.
func TestEventSettler(t *testing.T) {
	stream := "retry: 10\n\ndata:{\"usage\":{\"total_tokens\":5}}\n\n:c\r\ndata: [DONE]\r\n\r\n" +
		"data: {\"usage\":{\"total_tokens\":7.5}}\r\rdata: {\"total_tokens\":99}\n\n" +
		"data: {\"a/b\": 3}\n\ndata: {\"usage\":{\"total_tokens\":1}}"
	rules := map[string]Settle{"tokens": {JSON: "/usage/total_tokens"}, "odd": {JSON: "/a~1b"}, "hdr": {Header: "X-Used"}}
	for cut := 0; cut <= len(stream); cut++ {
		w := NewEventSettler(rules)
		w.Write([]byte(stream[:cut]))
		w.Write([]byte(stream[cut:]))
		// The last event is cut off before its blank line: not read.
		if got := w.Take(); len(got) != 2 || got["tokens"] != 8 || got["odd"] != 3 {
			t.Fatalf("cut at %d: found %v, want tokens 8 (7.5 rounded up) and odd 3", cut, got)
		}
	}
	w := NewEventSettler(rules)
	w.Write([]byte("data: {\"usage\":{\"total_tokens\":4}}\n\n"))
	if got := w.Take(); got["tokens"] != 4 {
		t.Errorf("got %v, want tokens 4", got)
	}
	if got := w.Take(); got != nil {
		t.Errorf("a second Take: got %v, want nothing new", got)
	}
	// An event over the cap is skipped, the next one read.
	w.Write([]byte("data: {\"usage\":{\"total_tokens\":9},\"pad\":\"" + strings.Repeat("x", SettleEventMaxBytes) + "\"}\n\ndata: {\"usage\":{\"total_tokens\":2}}\n\n"))
	if got := w.Take(); got["tokens"] != 2 {
		t.Errorf("after an event over the cap: got %v, want tokens 2 from the next", got)
	}
}

// TestSettleAmountOfEvents: a stored answer of server-sent events (a
// job's streamed chat completion) settles from its last event with the
// value; cut before it, the estimate stands.
func TestSettleAmountOfEvents(t *testing.T) {
	s := Settle{JSON: "/usage/total_tokens"}
	h := http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}}
	body := "data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"total_tokens\":40}}\n\ndata: [DONE]\n\n"
	if n, ok := s.Amount(h, []byte(body)); !ok || n != 40 {
		t.Errorf("got %d, %v; want 40", n, ok)
	}
	if _, ok := s.Amount(h, []byte(body[:60])); ok {
		t.Errorf("a stream cut before its usage gave an amount")
	}
	if _, ok := s.Amount(http.Header{"Content-Type": {"application/json"}}, []byte(body)); ok {
		t.Errorf("events read as JSON gave an amount")
	}
}
