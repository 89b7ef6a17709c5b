package queue

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"time"
	"unicode/utf8"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// How a job is stored in its task's payload.
//
// A queued job is held in Redis until it is sent, and a finished one until
// its retention ends, so every byte of the payload counts (issue 12). The
// stored form leaves out what the task already says (the ID, and an
// idempotency key that is the ID), names fields with one or two letters,
// writes times as Unix nanoseconds and keeps a body that is valid UTF-8
// (JSON, form data, text: nearly every API body) as a JSON string rather
// than base64.
//
// It is a JSON object with "v":2; a payload of any other version is
// refused rather than guessed at.
type storedJob struct {
	V         int               `json:"v"`
	Tenant    string            `json:"t,omitempty"`
	Upstream  string            `json:"u,omitempty"`
	Lane      string            `json:"l,omitempty"`
	Partition string            `json:"pa,omitempty"`
	Method    string            `json:"m,omitempty"`
	Path      string            `json:"p,omitempty"`
	Headers   map[string]string `json:"h,omitempty"`
	// Text is a body that is valid UTF-8; Bin any other body.
	Text        *string          `json:"b,omitempty"`
	Bin         []byte           `json:"bb,omitempty"`
	Task        string           `json:"k,omitempty"`
	Secrets     string           `json:"s,omitempty"`
	Cost        map[string]int64 `json:"c,omitempty"`
	Key         string           `json:"ik,omitempty"` // unless the ID
	MaxAttempts int              `json:"ma,omitempty"`
	NotBefore   int64            `json:"nb,omitempty"` // Unix ns
	ExpiresAt   int64            `json:"ex,omitempty"`
	CreatedAt   int64            `json:"ca,omitempty"`
	RetriedAt   int64            `json:"ra,omitempty"`
	Retries     int              `json:"r,omitempty"`
	PrevError   string           `json:"pe,omitempty"`
	CallbackURL string           `json:"cb,omitempty"`
	CallbackKey string           `json:"ck,omitempty"`
}

// storedVersion is the v of the stored form.
const storedVersion = 2

// unixNano is t in Unix nanoseconds, 0 for the zero time. Nanoseconds
// reach from 1678 to 2262; a time outside is stored as the nearest end,
// which means the same to a job (a not_before long past is past, an expiry
// centuries ahead is never).
func unixNano(t time.Time) int64 {
	switch {
	case t.IsZero():
		return 0
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

func fromUnixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

// EncodeJob is the payload a job is stored with: see storedJob.
func EncodeJob(j *Job) ([]byte, error) {
	s := storedJob{
		V: storedVersion, Tenant: j.Tenant, Upstream: j.Upstream, Lane: j.Lane, Partition: j.Partition,
		Method: j.Method, Path: j.Path, Headers: j.Headers, Task: j.Task, Secrets: j.Secrets, Cost: j.Cost,
		MaxAttempts: j.MaxAttempts, NotBefore: unixNano(j.NotBefore), ExpiresAt: unixNano(j.ExpiresAt),
		CreatedAt: unixNano(j.CreatedAt), RetriedAt: unixNano(j.RetriedAt), Retries: j.Retries, PrevError: j.PreviousError,
		CallbackURL: j.CallbackURL, CallbackKey: j.CallbackKey,
	}
	if j.IdempotencyKey != j.ID {
		s.Key = j.IdempotencyKey
	}
	s.Text, s.Bin = splitBody(j.Body)
	return compactJSON(&s)
}

// splitBody is a body as stored: as text when it is valid UTF-8, else as
// bytes (base64 in the JSON); neither when it is empty.
func splitBody(b []byte) (*string, []byte) {
	switch {
	case len(b) == 0:
		return nil, nil
	case utf8.Valid(b):
		text := string(b)
		return &text, nil
	default:
		return nil, b
	}
}

// compactJSON is v's JSON without a trailing newline and without escaping
// <, > and &, which a payload never shown as HTML does not need.
func compactJSON(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// DecodeJob reads a job stored by EncodeJob; id is the task's ID, which
// the stored form leaves out.
func DecodeJob(id string, payload []byte) (Job, error) {
	var s storedJob
	if err := json.Unmarshal(payload, &s); err != nil {
		return Job{}, err
	}
	if s.V != storedVersion {
		return Job{}, fmt.Errorf("stored job version %d: want %d", s.V, storedVersion)
	}
	j := Job{
		ID: id, Tenant: s.Tenant, Upstream: s.Upstream, Lane: s.Lane, Partition: s.Partition,
		Method: s.Method, Path: s.Path, Headers: s.Headers, Body: s.Bin, Task: s.Task, Secrets: s.Secrets,
		Cost: s.Cost, IdempotencyKey: s.Key, MaxAttempts: s.MaxAttempts,
		NotBefore: fromUnixNano(s.NotBefore), ExpiresAt: fromUnixNano(s.ExpiresAt),
		CreatedAt: fromUnixNano(s.CreatedAt), RetriedAt: fromUnixNano(s.RetriedAt),
		Retries: s.Retries, PreviousError: s.PrevError,
		CallbackURL: s.CallbackURL, CallbackKey: s.CallbackKey,
	}
	if s.Text != nil {
		j.Body = []byte(*s.Text)
	}
	if j.IdempotencyKey == "" {
		j.IdempotencyKey = id
	}
	return j, nil
}

// storedResponse is how an upstream's answer is kept with its finished
// job: short names, and a body that is valid UTF-8 as a JSON string
// rather than base64, as for storedJob.
type storedResponse struct {
	V         int                 `json:"v"`
	Status    int                 `json:"s"`
	Headers   map[string][]string `json:"h,omitempty"`
	Text      *string             `json:"b,omitempty"`
	Bin       []byte              `json:"bb,omitempty"`
	Truncated bool                `json:"t,omitempty"`
}

// EncodeResponse is how a finished job's response is stored.
func EncodeResponse(r *Response) ([]byte, error) {
	s := storedResponse{V: storedVersion, Status: r.Status, Headers: r.Headers, Truncated: r.Truncated}
	s.Text, s.Bin = splitBody(r.Body)
	return compactJSON(&s)
}

// DecodeResponse reads a response stored by EncodeResponse.
func DecodeResponse(b []byte) (Response, error) {
	var s storedResponse
	if err := json.Unmarshal(b, &s); err != nil {
		return Response{}, err
	}
	if s.V != storedVersion {
		return Response{}, fmt.Errorf("stored response version %d: want %d", s.V, storedVersion)
	}
	r := Response{Status: s.Status, Headers: s.Headers, Body: s.Bin, Truncated: s.Truncated}
	if s.Text != nil {
		r.Body = []byte(*s.Text)
	}
	return r, nil
}

// SucceededMessage is the message a succeeded job is kept with: its
// request's body and headers left out. Nothing reads them again (the API
// shows a job's method and path, not its request; only dead and cancelled
// jobs can be sent again), so a kept job costs its response and not its
// request as well (issue 12). The job is read from msg as it was stored,
// not from what a Go handler may have changed of it. msg is returned as it
// is if there is nothing to leave out or its job cannot be read.
func SucceededMessage(msg *jobstore.Message) *jobstore.Message {
	job, err := DecodeJob(msg.ID, msg.Payload)
	if err != nil {
		return msg
	}
	return SucceededJobMessage(msg, &job)
}
