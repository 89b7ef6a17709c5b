package fakeupstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// Vendor answers the endpoints the vendors' SDKs call with bodies those SDKs
// parse, so that a test can drive shaper with the SDKs themselves:
//
//   - POST /v1/chat/completions: an OpenAI chat completion; with
//     "stream": true in the body, server-sent events instead, one
//     chat.completion.chunk per word of the answer, Chunks of them spaced
//     ChunkDelay apart, then "data: [DONE]"; with "stream_options":
//     {"include_usage": true}, as OpenAI does, every chunk carries
//     "usage": null and a last chunk, without choices, the usage;
//   - POST /v1/customers: a Stripe customer made from the form-encoded body
//     (email, name, description, metadata[KEY]).
//
// Every other path gets the Server's own answer. The limits, the records
// and the report are the Server's: a request refused by a limit is answered
// in the Server's style, and an admitted one is recorded with the status of
// its answer (StatusClientClosed when the caller left mid-stream).
//
// Build one with Server.Vendor.
type Vendor struct {
	s   *Server
	opt VendorOptions

	mu   sync.Mutex
	seen []http.Header
}

// VendorOptions shape the streamed answers. The zero value streams 5 chunks
// 100 ms apart.
type VendorOptions struct {
	Chunks     int
	ChunkDelay time.Duration
}

// Vendor returns the vendor-shaped handler over s.
func (s *Server) Vendor(opt VendorOptions) *Vendor {
	if opt.Chunks <= 0 {
		opt.Chunks = 5
	}
	if opt.ChunkDelay <= 0 {
		opt.ChunkDelay = 100 * time.Millisecond
	}
	return &Vendor{s: s, opt: opt}
}

// Server is the Server whose limits and records the vendor uses.
func (v *Vendor) Server() *Server { return v.s }

// Headers are the request headers of every request that reached the
// vendor's endpoints, in arrival order, so that a test can check what a
// proxy let through (no hop-by-hop header, no caller's key).
func (v *Vendor) Headers() []http.Header {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.seen)
}

// ServeHTTP plays the vendor.
func (v *Vendor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s := v.s
	var answer func(w http.ResponseWriter, r *http.Request, d decision, body []byte) int
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/chat/completions":
		answer = v.chatCompletion
	case r.Method == http.MethodPost && r.URL.Path == "/v1/customers":
		answer = v.customer
	default:
		s.ServeHTTP(w, r)
		return
	}
	arrived := s.cfg.Now()
	v.mu.Lock()
	v.seen = append(v.seen, r.Header.Clone())
	v.mu.Unlock()
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	var bodyErr *requestError
	switch {
	case err != nil:
		bodyErr = &requestError{http.StatusBadRequest, "reading the body: " + err.Error()}
	case len(body) > MaxBodyBytes:
		bodyErr = &requestError{http.StatusRequestEntityTooLarge, fmt.Sprintf("body over %d bytes", MaxBodyBytes)}
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	key := apiKey(r)
	cost, costErr := s.requestCost(r)
	usage, usageErr := s.requestUsage(r, cost)
	for _, e := range []*requestError{usageErr, costErr, bodyErr} {
		if e != nil {
			costErr = e
		}
	}
	rec := Record{
		At:             arrived.Sub(s.start),
		Method:         r.Method,
		Path:           r.URL.Path,
		Key:            key,
		IdempotencyKey: r.Header.Get(s.cfg.IdempotencyHeader),
		Cost:           cost,
		Usage:          usage,
	}
	d := s.admit(&rec, costErr)
	if d.reason != admitted {
		s.finish(d, key, false, s.writeRefusal(w, d))
		return
	}
	if err := s.sleep(r.Context(), d.delay); err != nil {
		s.finish(d, key, true, StatusClientClosed)
		return
	}
	if d.fail != 0 {
		s.writeFailure(w, d, d.fail)
		s.finish(d, key, true, d.fail)
		return
	}
	s.setIDHeader(w, d)
	s.setLimitHeaders(w, d)
	s.finish(d, key, true, answer(w, r, d, body))
}

// chatRequest is what the fake reads of a chat completion request.
type chatRequest struct {
	Model         string `json:"model"`
	Stream        bool   `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	Messages []struct {
		Content any `json:"content"`
	} `json:"messages"`
}

type chatMessage struct {
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
}

type chatChoice struct {
	Index        int          `json:"index"`
	Message      *chatMessage `json:"message,omitempty"`
	Delta        *chatMessage `json:"delta,omitempty"`
	FinishReason *string      `json:"finish_reason"`
}

type chatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []chatChoice `json:"choices"`
	Usage   *openAIUsage `json:"usage,omitempty"`
}

// chatChunkWithUsage is a streamed chunk when the caller asked for usage:
// "usage" is always there, null but in the last chunk.
type chatChunkWithUsage struct {
	chatCompletion
	Usage *openAIUsage `json:"usage"`
}

// chatCompletion answers with the words "chunk 1 … chunk N", whole or one
// word per event.
func (v *Vendor) chatCompletion(w http.ResponseWriter, r *http.Request, d decision, body []byte) int {
	var req chatRequest
	if err := json.Unmarshal(body, &req); err != nil {
		writeJSON(w, http.StatusBadRequest, openAIError{openAIErrorBody{Message: "the body is not a chat completion request: " + err.Error(), Type: "invalid_request_error"}})
		return http.StatusBadRequest
	}
	if req.Model == "" {
		req.Model = "gpt-fake"
	}
	id := "chatcmpl-" + d.id
	created := v.s.cfg.Now().Unix()
	words := make([]string, v.opt.Chunks)
	for i := range words {
		words[i] = fmt.Sprintf("chunk %d", i+1)
	}
	stop := "stop"
	usage := usageOf(max(d.charge, int64(len(words))))
	if !req.Stream {
		writeJSON(w, http.StatusOK, chatCompletion{
			ID: id, Object: "chat.completion", Created: created, Model: req.Model,
			Choices: []chatChoice{{Message: &chatMessage{Role: "assistant", Content: strings.Join(words, " ")}, FinishReason: &stop}},
			Usage:   usage,
		})
		return http.StatusOK
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flush := func() { http.NewResponseController(w).Flush() }
	event := func(c chatCompletion) error {
		var b []byte
		if req.StreamOptions.IncludeUsage {
			b, _ = json.Marshal(chatChunkWithUsage{chatCompletion: c, Usage: c.Usage})
		} else {
			b, _ = json.Marshal(c) // our own plain structs: cannot fail
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		flush()
		return nil
	}
	for i, word := range words {
		if i > 0 {
			if err := v.s.sleep(r.Context(), v.opt.ChunkDelay); err != nil {
				return StatusClientClosed
			}
			word = " " + word
		}
		c := chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.Model,
			Choices: []chatChoice{{Delta: &chatMessage{Content: word}}}}
		if i == 0 {
			c.Choices[0].Delta.Role = "assistant"
		}
		if i == len(words)-1 {
			c.Choices[0].FinishReason = &stop
		}
		if event(c) != nil {
			return StatusClientClosed
		}
	}
	if req.StreamOptions.IncludeUsage {
		last := chatCompletion{ID: id, Object: "chat.completion.chunk", Created: created, Model: req.Model, Choices: []chatChoice{}, Usage: usage}
		if event(last) != nil {
			return StatusClientClosed
		}
	}
	if _, err := io.WriteString(w, "data: [DONE]\n\n"); err != nil {
		return StatusClientClosed
	}
	flush()
	return http.StatusOK
}

// stripeCustomer is the part of Stripe's customer object the SDKs' types
// carry and the tests look at.
type stripeCustomer struct {
	ID          string            `json:"id"`
	Object      string            `json:"object"`
	Created     int64             `json:"created"`
	Description *string           `json:"description"`
	Email       *string           `json:"email"`
	Livemode    bool              `json:"livemode"`
	Metadata    map[string]string `json:"metadata"`
	Name        *string           `json:"name"`
}

// customer creates a customer from Stripe's form encoding.
func (v *Vendor) customer(w http.ResponseWriter, r *http.Request, d decision, body []byte) int {
	form, err := url.ParseQuery(string(body))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, stripeError{stripeErrorBody{Message: "the body is not form-encoded: " + err.Error(), Type: "invalid_request_error"}})
		return http.StatusBadRequest
	}
	field := func(name string) *string {
		if !form.Has(name) {
			return nil
		}
		s := form.Get(name)
		return &s
	}
	c := stripeCustomer{
		ID: "cus_" + strings.TrimPrefix(d.id, "req_"), Object: "customer", Created: v.s.cfg.Now().Unix(),
		Description: field("description"), Email: field("email"), Name: field("name"), Metadata: map[string]string{},
	}
	for k, vs := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(vs) > 0 {
			c.Metadata[strings.TrimSuffix(name, "]")] = vs[0]
		}
	}
	writeJSON(w, http.StatusOK, c)
	return http.StatusOK
}
