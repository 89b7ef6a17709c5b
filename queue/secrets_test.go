package queue

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/internal/testsupport/redistest"
)

func secretKeys(t *testing.T, q *Queue) []string {
	t.Helper()
	keys, err := q.rdb.Keys(context.Background(), q.prefix+":secrets:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestSensitiveHeadersKeptAside: sensitive headers never enter the stored
// job; they wait in one side key per job, which an idempotent repeat does
// not overwrite or leave behind, and which Cancel removes.
func TestSensitiveHeadersKeptAside(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	ups := upstreams(100)
	ups[0].SensitiveHeaders = []string{"X-*-Token"}
	q := newQueue(t, rdb, ups)
	headers := map[string]string{"Authorization": "Bearer first", "cookie": "sid=1", "X-Api-Token": "tok", "X-Trace": "t1"}
	info, created, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/a", Headers: headers,
		IdempotencyKey: "k", NotBefore: time.Now().Add(time.Hour)})
	if err != nil || !created {
		t.Fatalf("enqueue: %v, %v", created, err)
	}
	if len(headers) != 4 {
		t.Fatalf("the caller's headers were changed: %v", headers)
	}
	got, err := q.Get(ctx, info.ID, "billing")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Headers) != 1 || got.Headers["X-Trace"] != "t1" || got.Secrets == "" {
		t.Fatalf("stored headers %v, secrets %q: want only X-Trace, and a side key", got.Headers, got.Secrets)
	}
	key := SecretsKey(q.prefix, &got.Job)
	if keys := secretKeys(t, q); len(keys) != 1 || keys[0] != key {
		t.Fatalf("side keys %v, want just %s", keys, key)
	}
	if !strings.Contains(key, "{"+jobstore.QueueName("stripe")+"}") {
		t.Errorf("side key %s lacks the queue's hash tag", key)
	}
	// Until not_before plus the backstop.
	if ttl := rdb.TTL(ctx, key).Val(); ttl < time.Hour+secretsBackstop-time.Minute || ttl > time.Hour+secretsBackstop {
		t.Errorf("side key TTL %v, want about 1h + %v", ttl, secretsBackstop)
	}
	secret, err := LoadSecrets(ctx, rdb, q.prefix, &got.Job, time.Now())
	if err != nil || len(secret) != 3 || secret["Authorization"] != "Bearer first" || secret["cookie"] != "sid=1" || secret["X-Api-Token"] != "tok" {
		t.Fatalf("LoadSecrets: got %v, %v", secret, err)
	}

	// A repeat finds the first job and leaves its side key alone.
	again, created, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/a", IdempotencyKey: "k",
		Headers: map[string]string{"Authorization": "Bearer second"}})
	if err != nil || created || again.ID != info.ID {
		t.Fatalf("repeat: %v, %v, %v", again, created, err)
	}
	if keys := secretKeys(t, q); len(keys) != 1 || keys[0] != key {
		t.Fatalf("after the repeat: side keys %v, want just the first job's %s", keys, key)
	}
	if secret, _ := LoadSecrets(ctx, rdb, q.prefix, &got.Job, time.Now()); secret["Authorization"] != "Bearer first" {
		t.Fatalf("after the repeat: Authorization %q, want the first job's", secret["Authorization"])
	}

	// A job with a ttl keeps them until it expires.
	short, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/b", ExpiresAt: time.Now().Add(10 * time.Minute),
		Headers: map[string]string{"Authorization": "Bearer short"}})
	if err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.TTL(ctx, SecretsKey(q.prefix, &short.Job)).Val(); ttl < 10*time.Minute || ttl > 11*time.Minute {
		t.Errorf("side key TTL of a job with a 10m ttl: %v, want 10m plus a minute", ttl)
	}

	// The batch path keeps them aside the same way.
	r := q.EnqueueBatch(ctx, []*Job{{Tenant: "billing", Upstream: "stripe", Path: "/m", Headers: map[string]string{"Cookie": "sid=m"}}})[0]
	many, err := r.Info, r.Err
	if err != nil {
		t.Fatal(err)
	}
	if secret, err := LoadSecrets(ctx, rdb, q.prefix, &many.Job, time.Now()); err != nil || secret["Cookie"] != "sid=m" || many.Headers != nil {
		t.Fatalf("EnqueueBatch: side key %v, %v; stored headers %v", secret, err, many.Headers)
	}

	// A job without sensitive headers has no side key.
	plain, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/c", Headers: map[string]string{"X-Trace": "t2"}})
	if err != nil || plain.Secrets != "" {
		t.Fatalf("plain job: secrets %q, %v", plain.Secrets, err)
	}

	if _, err := q.Cancel(ctx, info.ID, "billing"); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("Cancel left the job's sensitive headers behind")
	}
	if _, err := LoadSecrets(ctx, rdb, q.prefix, &got.Job, time.Now()); !errors.Is(err, ErrSecretsGone) {
		t.Fatalf("LoadSecrets after Cancel: got %v, want ErrSecretsGone", err)
	}
}

// TestSecretsWithoutRedis62Commands keeps the side key's life within what
// Redis 5 offers (the README's promise): a real server with the commands
// of Redis 6.2 and later that touch a plain key renamed away.
func TestSecretsWithoutRedis62Commands(t *testing.T) {
	ctx := context.Background()
	var args []string
	for _, cmd := range []string{"GETEX", "GETDEL", "COPY", "EXPIRETIME", "PEXPIRETIME"} {
		args = append(args, "--rename-command", cmd, "")
	}
	old := redistest.New(t, redistest.Options{Args: args})
	rdb := old.Client(t)
	if err := rdb.Do(ctx, "GETEX", "k").Err(); err == nil || !strings.Contains(err.Error(), "unknown command") {
		t.Fatalf("GETEX on the restricted server: got %v, want an unknown command error", err)
	}
	q := newQueue(t, rdb, upstreams(100))
	info, _, err := q.Enqueue(ctx, &Job{Tenant: "billing", Upstream: "stripe", Path: "/a", Headers: map[string]string{"Authorization": "Bearer x"}})
	if err != nil {
		t.Fatal(err)
	}
	key := SecretsKey(q.prefix, &info.Job)
	rdb.Expire(ctx, key, time.Minute)
	secret, err := LoadSecrets(ctx, rdb, q.prefix, &info.Job, time.Now())
	if err != nil || secret["Authorization"] != "Bearer x" {
		t.Fatalf("LoadSecrets: got %v, %v; want the job's Authorization", secret, err)
	}
	if ttl := rdb.TTL(ctx, key).Val(); ttl < secretsBackstop-time.Minute {
		t.Errorf("side key TTL after LoadSecrets: got %v, want it renewed to about %v", ttl, secretsBackstop)
	}
	if _, err := q.Cancel(ctx, info.ID, "billing"); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSecrets(ctx, rdb, q.prefix, &info.Job, time.Now()); !errors.Is(err, ErrSecretsGone) {
		t.Fatalf("LoadSecrets after Cancel: got %v, want ErrSecretsGone", err)
	}
}

// TestRenewSecrets: a hand-back renews the side key for its delay plus a
// backstop long enough for a backlog weeks deep; a job with a ttl keeps
// them only until it expires; a key already gone is not brought back.
func TestRenewSecrets(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q := newQueue(t, rdb, upstreams(100))
	now := time.Now()
	if secretsBackstop < 4*7*24*time.Hour {
		t.Errorf("backstop %v: a job waiting in a backlog a few weeks deep would lose its headers", secretsBackstop)
	}
	for _, tc := range []struct {
		name             string
		job              Job
		delay            time.Duration
		wantMin, wantMax time.Duration
	}{
		{"short wait", Job{Path: "/a"}, time.Second, secretsBackstop, secretsBackstop + time.Second},
		{"pause of a year", Job{Path: "/b"}, 365 * 24 * time.Hour, 365*24*time.Hour + secretsBackstop - time.Second, 365*24*time.Hour + secretsBackstop},
		{"with a ttl", Job{Path: "/c", ExpiresAt: now.Add(time.Hour)}, 365 * 24 * time.Hour, time.Hour, time.Hour + secretsSlack},
	} {
		tc.job.Tenant, tc.job.Upstream, tc.job.Headers = "t", "stripe", map[string]string{"Cookie": "sid=1"}
		info, _, err := q.Enqueue(ctx, &tc.job)
		if err != nil {
			t.Fatal(err)
		}
		if err := RenewSecrets(ctx, rdb, q.prefix, &info.Job, now, tc.delay); err != nil {
			t.Fatal(err)
		}
		if ttl := rdb.PTTL(ctx, SecretsKey(q.prefix, &info.Job)).Val(); ttl < tc.wantMin-time.Second || ttl > tc.wantMax {
			t.Errorf("%s: TTL %v, want between %v and %v", tc.name, ttl, tc.wantMin, tc.wantMax)
		}
	}
	gone := Job{ID: "stripe.default.x", Upstream: "stripe", Lane: "default", Secrets: "00"}
	if err := RenewSecrets(ctx, rdb, q.prefix, &gone, now, time.Hour); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, SecretsKey(q.prefix, &gone)).Val(); n != 0 {
		t.Error("RenewSecrets brought back a side key that was gone")
	}
	if err := RenewSecrets(ctx, rdb, q.prefix, &Job{ID: "stripe.default.y"}, now, time.Hour); err != nil {
		t.Errorf("a job without secrets: got %v, want nothing to do", err)
	}
}
