package fakeupstream

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestVendorChatCompletion(t *testing.T) {
	clock := &fakeClock{t: epoch}
	s, err := New(Config{Rate: 1, Per: time.Second, Style: StyleOpenAI, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	v := s.Vendor(VendorOptions{Chunks: 3})
	post := func(body string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(body))
		r.Header.Set("Authorization", "Bearer sk-real")
		w := httptest.NewRecorder()
		v.ServeHTTP(w, r)
		return w
	}
	w := post(`{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}`)
	var got chatCompletion
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil || w.Code != 200 {
		t.Fatalf("got %d %q (%v), want 200 and a chat completion", w.Code, w.Body, err)
	}
	if got.Object != "chat.completion" || got.Model != "gpt-4o-mini" || got.Choices[0].Message.Content != "chunk 1 chunk 2 chunk 3" {
		t.Errorf("got %+v, want the model echoed and the three words", got)
	}
	if w := post(`{"model":"m","messages":[]}`); w.Code != 429 || w.Header().Get("Retry-After") == "" {
		t.Errorf("second call within the second: got %d, Retry-After %q; want 429 with Retry-After", w.Code, w.Header().Get("Retry-After"))
	}
	if r := s.Report(); r.Total != 2 || r.Rejected != 1 || len(v.Headers()) != 2 || r.Keys["sk-real"].Requests != 2 {
		t.Errorf("report %v, %d headers seen; want 2 requests by sk-real, 1 rejected", r, len(v.Headers()))
	}
}

func TestVendorStreamsEachChunkOnItsOwn(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Each pause between chunks waits for the test to have read the chunk
	// before it, so the test fails if the chunks come together.
	read := make(chan struct{})
	s.sleep = func(ctx context.Context, d time.Duration) error {
		if d == 0 {
			return nil
		}
		select {
		case <-read:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	hs := httptest.NewServer(s.Vendor(VendorOptions{Chunks: 4}))
	defer hs.Close()
	resp, err := http.Post(hs.URL+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"m","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q, want text/event-stream", ct)
	}
	sc := bufio.NewScanner(resp.Body)
	var text string
	var events int
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			break
		}
		var c chatCompletion
		if err := json.Unmarshal([]byte(data), &c); err != nil || c.Object != "chat.completion.chunk" {
			t.Fatalf("event %q (%v), want a chat.completion.chunk", data, err)
		}
		text += c.Choices[0].Delta.Content
		if events++; events < 4 {
			read <- struct{}{}
		}
	}
	if events != 4 || text != "chunk 1 chunk 2 chunk 3 chunk 4" {
		t.Errorf("got %d events saying %q, want 4 saying the four words", events, text)
	}
}

func TestVendorCustomer(t *testing.T) {
	s, err := New(Config{Style: StyleStripe})
	if err != nil {
		t.Fatal(err)
	}
	r := httptest.NewRequest("POST", "/v1/customers", strings.NewReader("email=a%40example.com&name=Ada&metadata[order]=42"))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	w := httptest.NewRecorder()
	s.Vendor(VendorOptions{}).ServeHTTP(w, r)
	var c stripeCustomer
	if err := json.Unmarshal(w.Body.Bytes(), &c); err != nil || w.Code != 200 {
		t.Fatalf("got %d %q (%v), want 200 and a customer", w.Code, w.Body, err)
	}
	if !strings.HasPrefix(c.ID, "cus_") || c.Object != "customer" || *c.Email != "a@example.com" || *c.Name != "Ada" || c.Metadata["order"] != "42" || c.Description != nil {
		t.Errorf("got %+v, want the form's fields back in a customer", c)
	}
}

// TestVendorStreamsUsage: with stream_options.include_usage, as OpenAI
// does, every chunk says "usage": null and a last chunk without choices
// carries the usage, before [DONE].
func TestVendorStreamsUsage(t *testing.T) {
	s, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	s.sleep = func(context.Context, time.Duration) error { return nil }
	r := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true,"stream_options":{"include_usage":true}}`))
	r.Header.Set(UsageHeader, "42")
	w := httptest.NewRecorder()
	s.Vendor(VendorOptions{Chunks: 2}).ServeHTTP(w, r)
	var events []string
	for _, line := range strings.Split(w.Body.String(), "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			events = append(events, data)
		}
	}
	if len(events) != 4 || events[3] != "[DONE]" {
		t.Fatalf("got events %q, want 2 chunks, the usage and [DONE]", events)
	}
	for i, ev := range events[:2] {
		if !strings.Contains(ev, `"usage":null`) {
			t.Errorf("chunk %d %s: want \"usage\":null", i, ev)
		}
	}
	var last chatCompletion
	if err := json.Unmarshal([]byte(events[2]), &last); err != nil || len(last.Choices) != 0 || last.Usage == nil || last.Usage.TotalTokens != 42 {
		t.Errorf("last chunk %s (%v): want no choices and usage.total_tokens 42", events[2], err)
	}
}
