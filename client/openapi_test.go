package client_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/api"
	"github.com/shaperhq/shaper/client"
	"github.com/shaperhq/shaper/internal/testsupport/apicheck"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/metrics"
	"github.com/shaperhq/shaper/queue"
	"github.com/shaperhq/shaper/server"
	"github.com/shaperhq/shaper/status"
	"github.com/shaperhq/shaper/tokenbucket"
)

// realServer serves the API on a real Redis with admission capacity
// admission, for keys "billing-secret" and "ops-secret" (admin).
func realServer(t *testing.T, admission int64) string {
	t.Helper()
	rdb := redistest.New(t).Client(t)
	ups := []shaper.Upstream{{Name: "stripe", BaseURL: "https://api.stripe.com", Limits: []leaky.Limit{leaky.PerSecond(100)},
		MaxPending: 1000, Retry: shaper.Retry{MaxAttempts: 3}, ResultRetention: time.Hour, DeadRetention: time.Hour}}
	q, err := queue.New(rdb, queue.Config{Upstreams: ups})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { q.Close() })
	st, err := status.NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	s, err := server.New(rdb, q, st, server.Config{
		Keys:      []server.Key{{Name: "billing", Secret: "billing-secret"}, {Name: "ops", Secret: "ops-secret", Admin: true}},
		Admission: tokenbucket.Limit{Capacity: admission, Refill: 1, Per: time.Hour},
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)), Metrics: metrics.New(reg), Registry: reg,
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

// TestClientKeepsToTheDocument drives every client method against a real
// server through a transport that checks each exchange against the OpenAPI
// document: what the client sends must be a request the document allows
// (when the server takes it), and what it reads back a documented answer.
// Refusals are driven too, since the client decodes those as well.
func TestClientKeepsToTheDocument(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a server on a real redis-server")
	}
	base := realServer(t, 5)
	chk, err := apicheck.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.New(base, "billing-secret", client.WithHTTPClient(chk.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(base, "ops-secret", client.WithHTTPClient(chk.Client(t)))
	if err != nil {
		t.Fatal(err)
	}

	job, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Method: "POST", Path: "/v1/charges",
		Headers: map[string]string{"Content-Type": "application/json"}, Body: []byte(`{"amount":1}`),
		IdempotencyKey: "order-1", MaxAttempts: 2, NotBefore: time.Now().Add(time.Hour), TTL: 2 * time.Hour, Partition: "acme"})
	if err != nil || job.ID == "" || job.State != client.StateScheduled || job.Partition != "acme" {
		t.Fatalf("Enqueue: got %+v, %v", job, err)
	}
	again, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/v1/charges", IdempotencyKey: "order-1"})
	if err != nil || !again.Existing || again.ID != job.ID || again.Tenant != "billing" {
		t.Fatalf("Enqueue again: got %+v, %v; want the existing job", again, err)
	}
	results, err := c.EnqueueBatch(ctx, []client.JobRequest{
		{Upstream: "stripe", Path: "/a", Body: []byte{0, 1, 0xff}},
		{Upstream: "stripe", Path: "no-slash"},
	})
	if err != nil || len(results) != 2 || results[0].Status != 202 || results[1].Status != 400 || !errors.Is(results[1].Err, client.ErrInvalid) {
		t.Fatalf("EnqueueBatch: got %+v, %v", results, err)
	}
	got, err := c.Get(ctx, job.ID)
	if err != nil || got.Tenant != "billing" || got.MaxAttempts != 2 || got.ExpiresAt.IsZero() || got.NotBefore.IsZero() {
		t.Fatalf("Get: got %+v, %v", got, err)
	}
	cancelled, err := c.Cancel(ctx, job.ID)
	if err != nil || cancelled.State != client.StateCancelled {
		t.Fatalf("Cancel: got %+v, %v", cancelled, err)
	}
	if _, err := c.Cancel(ctx, job.ID); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("Cancel again: got %v, want ErrConflict", err)
	}
	// Wait reads a finished job back.
	if done, err := c.Wait(ctx, job.ID); err != nil || done.State != client.StateCancelled {
		t.Fatalf("Wait: got %+v, %v", done, err)
	}
	if _, err := c.Get(ctx, "stripe.default.nope"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Get unknown: got %v, want ErrNotFound", err)
	}
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "twilio", Path: "/x"}); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Enqueue to an unknown upstream: got %v, want ErrNotFound", err)
	}

	ups, err := c.Upstreams(ctx)
	if err != nil || len(ups) != 1 || ups[0].Name != "stripe" || len(ups[0].Limits) != 1 || ups[0].Backlog.Lanes["default"].Scheduled+ups[0].Backlog.Lanes["default"].Pending == 0 {
		t.Fatalf("Upstreams: got %+v, %v", ups, err)
	}
	if _, err := c.Upstream(ctx, "twilio"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Upstream unknown: got %v, want ErrNotFound", err)
	}
	if _, err := c.Pause(ctx, "stripe", time.Minute); err == nil {
		t.Fatal("Pause with a key that is not admin: got no error, want 403")
	}
	paused, err := admin.Pause(ctx, "stripe", time.Minute)
	if err != nil || paused.PausedUntil.IsZero() || !paused.Paused(time.Now()) {
		t.Fatalf("Pause: got %+v, %v", paused, err)
	}
	forever, err := admin.Pause(ctx, "stripe", 0)
	if err != nil || forever.PausedUntil.Before(paused.PausedUntil) {
		t.Fatalf("Pause until resumed: got %+v, %v", forever, err)
	}
	resumed, err := admin.Resume(ctx, "stripe")
	if err != nil || !resumed.PausedUntil.IsZero() {
		t.Fatalf("Resume: got %+v, %v", resumed, err)
	}
	if _, err := c.RetryDead(ctx, "stripe"); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("RetryDead with a key that is not admin: got %v, want ErrUnauthorized (403)", err)
	}
	// The cancelled job stays cancelled; nothing is dead.
	if res, err := admin.RetryDead(ctx, "stripe"); err != nil || res.Upstream != "stripe" || res.Retried != 0 || res.Skipped != 0 {
		t.Fatalf("RetryDead: got %+v, %v", res, err)
	}
	one, err := c.Upstream(ctx, "stripe")
	if err != nil || one.Name != "stripe" {
		t.Fatalf("Upstream: got %+v, %v", one, err)
	}

	// The key's five tokens are spent: a refusal with Retry-After, which
	// WithRetry would wait out, is documented too.
	if _, err := c.Enqueue(ctx, client.JobRequest{Upstream: "stripe", Path: "/late"}); !errors.Is(err, client.ErrRateLimited) {
		t.Fatalf("Enqueue past admission: got %v, want ErrRateLimited", err)
	}
	bad, err := client.New(base, "nope", client.WithHTTPClient(chk.Client(t)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bad.Upstreams(ctx); !errors.Is(err, client.ErrUnauthorized) {
		t.Fatalf("unknown key: got %v, want ErrUnauthorized", err)
	}
}

// TestClientFieldsAreDocumented: every JSON field the client's answer types
// read is a property of the document's schema for that answer, so the
// client expects nothing the API does not promise.
func TestClientFieldsAreDocumented(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.YAML())
	if err != nil {
		t.Fatal(err)
	}
	schemas := doc.Components.Schemas
	for _, tc := range []struct {
		typ    reflect.Type
		schema string
	}{
		{reflect.TypeFor[client.Job](), "Job"},
		{reflect.TypeFor[client.UpstreamStatus](), "UpstreamStatus"},
		{reflect.TypeFor[client.LaneCounts](), "LaneCounts"},
		{reflect.TypeFor[client.Schedule](), "Schedule"},
	} {
		checkFields(t, tc.typ, schemas[tc.schema].Value, tc.schema)
	}
	// RetryDeadResult's schema is the retry-dead operation's own.
	op := doc.Paths.Find("/v1/upstreams/{name}/retry-dead").Post
	ok := op.Responses.Status(200).Value.Content.Get("application/json").Schema.Value
	checkFields(t, reflect.TypeFor[client.RetryDeadResult](), ok, "retry-dead 200")
}

// checkFields checks a struct's JSON fields against a schema's
// properties, and its struct-valued fields against theirs, where the
// schema spells them out inline.
func checkFields(t *testing.T, typ reflect.Type, s *openapi3.Schema, at string) {
	t.Helper()
	checked := 0
	for f := range typ.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || name == "" || !f.IsExported() {
			continue
		}
		prop, ok := s.Properties[name]
		if !ok {
			t.Errorf("%s: the client reads %q (%s.%s), which the document does not have", at, name, typ.Name(), f.Name)
			continue
		}
		checked++
		// A type that decodes itself (JobRequest) has no field tags to check.
		decodesItself := reflect.PointerTo(f.Type).Implements(reflect.TypeFor[json.Unmarshaler]())
		if ft := f.Type; ft.Kind() == reflect.Struct && ft.PkgPath() == typ.PkgPath() && len(prop.Value.Properties) > 0 && !decodesItself {
			checkFields(t, ft, prop.Value, at+"."+name)
		}
	}
	if checked == 0 {
		t.Errorf("%s: no JSON fields checked in %s", at, typ.Name())
	}
}
