// Package queue keeps shaper's jobs in Redis in asynq's layout: one asynq
// queue per upstream, all its lanes together, whose keys carry the queue's
// name as a hash tag so each upstream lives in one Redis Cluster slot; the
// order jobs go in is internal/jobstore's. It defines the job model, enqueues
// idempotently, bounds each upstream's backlog, reads jobs and queue
// statistics back for the API and `shaper status`.
//
// The dispatcher package drains these queues; this package only stores.
package queue

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/shaperhq/shaper"
)

// TaskType is the asynq task type of every shaper job.
const TaskType = "shaper:job"

// Job is one call bound for an upstream: an HTTP request relative to the
// upstream's base URL, or, for upstreams served by a Go handler, a named task
// with a payload in Body.
type Job struct {
	ID       string `json:"id"`
	Tenant   string `json:"tenant"`
	Upstream string `json:"upstream"`
	Lane     string `json:"lane"`
	// Partition, when set, is what the job is paced by within its
	// upstream besides the upstream's own limits (a recipient domain, a
	// customer or credential id): the upstream's partition limits apply
	// to it, and fairness by partition shares slots among partitions.
	// Where neither is configured it only labels the job. See
	// shaper.CheckPartition for what it may hold.
	Partition string `json:"partition,omitempty"`

	Method  string            `json:"method,omitempty"`
	Path    string            `json:"path,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    []byte            `json:"body,omitempty"`
	// Task names the work for a Go handler upstream.
	Task string `json:"task,omitempty"`
	// Secrets, set by Enqueue, names the side key that holds the job's
	// sensitive headers (see SecretsKey); they are not in Headers as
	// stored, only in the side key until the job finishes.
	Secrets string `json:"secrets,omitempty"`

	// Cost is the job's amounts by name ({"tokens": 1200}); each of the
	// upstream's limits with a cost name counts its amount, every limit
	// without one counts the request.
	Cost map[string]int64 `json:"cost,omitempty"`
	// IdempotencyKey is sent to the upstream on every attempt; the producer's
	// key when given, else the job's ID.
	IdempotencyKey string `json:"idempotency_key"`
	MaxAttempts    int    `json:"max_attempts"`
	// NotBefore delays the first attempt.
	NotBefore time.Time `json:"not_before,omitzero"`
	// ExpiresAt, when set, is when the job is given up (dead) if it has not
	// been dispatched by then.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	CreatedAt time.Time `json:"created_at"`
	// RetriedAt is when an operator last sent the dead or cancelled job
	// back to the queue (Retry), Retries how often, and PreviousError the
	// last error it had then; Retry resets its attempts and last error.
	RetriedAt     time.Time `json:"retried_at,omitzero"`
	Retries       int       `json:"retries,omitempty"`
	PreviousError string    `json:"previous_error,omitempty"`

	// CallbackURL, when set, is POSTed the job's final view, signed, once
	// it succeeds, dies or is cancelled (see internal/callback); the API
	// checks it against callbacks.allowed_hosts. CallbackKey names the API
	// key whose secret signs it (its callback_secret_env, else
	// callbacks.secret_env).
	CallbackURL string `json:"callback_url,omitempty"`
	CallbackKey string `json:"callback_key,omitempty"`
}

// State is where a job is in its life.
type State string

const (
	StateQueued    State = "queued"
	StateScheduled State = "scheduled"
	StateActive    State = "active"
	StateRetrying  State = "retrying"
	StateSucceeded State = "succeeded"
	StateDead      State = "dead"
	StateCancelled State = "cancelled"
)

// Response is what the upstream answered, as stored with the job.
type Response struct {
	Status    int                 `json:"status"`
	Headers   map[string][]string `json:"headers,omitempty"`
	Body      []byte              `json:"body,omitempty"`
	Truncated bool                `json:"truncated,omitempty"`
}

// ValidName reports whether s can name an upstream or a lane (they become
// queue names and Redis hash tags): shaper.ValidName.
func ValidName(s string) bool { return shaper.ValidName(s) }

// A job ID names its upstream and lane, so a job can be found without an
// index, and carries a tag of its tenant, so a lookup by another tenant is
// refused before Redis is touched (no timing difference tells whether a
// foreign job exists, however large):
//
//	stripe.default.3fa9c1d2-k4xq7m...   random (NewID)
//	stripe.default.3fa9c1d2-i9be0c...   from an idempotency key (IdempotentID)
//
// The tag is the first 8 hex digits of a SHA-256 of the tenant: not a secret
// (anyone who knows a tenant's name can compute it), only a filter. Two
// tenants share a tag with odds of one in four billion; then the tenant
// stored in the job decides, as it does for an ID a Go caller set in
// Job.ID without a tag ("stripe.default.order-17"). IDs hold only
// [a-z0-9._-], so they are valid asynq task IDs and never contain a Redis
// Cluster hash tag's braces.

// tagLen is the length of the tenant tag at the start of an ID's last part.
const tagLen = 8

// tenantTag is the tag job IDs of a tenant carry.
func tenantTag(tenant string) string {
	sum := sha256.Sum256([]byte("shaper tenant\x00" + tenant))
	return hex.EncodeToString(sum[:tagLen/2])
}

// NewID makes a random job ID for a tenant's job on an upstream's lane.
func NewID(tenant, upstream, lane string) string {
	var b [15]byte
	rand.Read(b[:])
	return upstream + "." + lane + "." + tenantTag(tenant) + "-" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:]))
}

// IdempotentID is the job ID for a producer's idempotency key: the same
// tenant, upstream, lane and key always give the same ID, so asynq's unique
// task IDs make a repeated enqueue find the first job.
func IdempotentID(tenant, upstream, lane, key string) string {
	return upstream + "." + lane + "." + tenantTag(tenant) + "-" + idempotentPart(tenant, key)
}

func idempotentPart(tenant, key string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + key))
	return "i" + hex.EncodeToString(sum[:idemHexLen/2])
}

// idemHexLen is how many hex digits follow the "i" of an IdempotentID's
// last part. A NewID's last part is 24 base32 letters, so the two cannot
// be mistaken for each other.
const idemHexLen = 30

// IdempotentIDPattern is the Lua pattern an IdempotentID's last part matches
// (tenant tag, "-i", hex digits) and a NewID's does not: its records
// outlive the job (see jobstore.Space.FinishBounds). It is also a Go regular expression
// once each %x is a hex class, which TestIdemIDPattern holds to tagLen,
// idemHexLen and IsIdempotentID.
const IdempotentIDPattern = "[.]" + "%x%x%x%x%x%x%x%x" + "[-]i" +
	"%x%x%x%x%x%x%x%x%x%x" + "%x%x%x%x%x%x%x%x%x%x" + "%x%x%x%x%x%x%x%x%x%x" + "$"

// IsIdempotentID reports whether id was made by IdempotentID.
func IsIdempotentID(id string) bool {
	tag, ok := idTag(id)
	if !ok {
		return false
	}
	last := id[strings.LastIndexByte(id, '.')+1+len(tag)+1:]
	if len(last) != 1+idemHexLen || last[0] != 'i' {
		return false
	}
	for _, c := range last[1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// ParseID splits a job ID into its upstream and lane. It accepts IDs with
// and without a tenant tag.
func ParseID(id string) (upstream, lane string, err error) {
	parts := strings.Split(id, ".")
	if len(parts) != 3 || !ValidName(parts[0]) || !ValidName(parts[1]) || parts[2] == "" || len(id) > 200 {
		return "", "", fmt.Errorf("job id %q: not a shaper job id", id)
	}
	return parts[0], parts[1], nil
}

// idTag returns the tenant tag of an ID, or false for an ID set by hand
// that has none.
func idTag(id string) (string, bool) {
	last := id[strings.LastIndexByte(id, '.')+1:]
	if len(last) <= tagLen || last[tagLen] != '-' {
		return "", false
	}
	for i := 0; i < tagLen; i++ {
		if c := last[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return last[:tagLen], true
}

// foreignID reports whether an ID's tag shows that it cannot be the
// tenant's job. IDs without a tag are never foreign by this test.
func foreignID(id, tenant string) bool {
	tag, ok := idTag(id)
	return ok && tag != tenantTag(tenant)
}
