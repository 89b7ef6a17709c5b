package status

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/internal/jobstore"
	"github.com/shaperhq/shaper/leaky"
	"github.com/shaperhq/shaper/queue"
)

func TestPauseAndResume(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name         string
		d            time.Duration
		wantErr      bool
		wantLeft     time.Duration // about; 0 when not paused
		untilResumed bool
	}{
		{name: "for ten minutes", d: 10 * time.Minute, wantLeft: 10 * time.Minute},
		{name: "until resumed", d: 0, wantLeft: Indefinitely, untilResumed: true},
		{name: "for a year", d: Indefinitely, wantLeft: Indefinitely, untilResumed: true},
		{name: "negative", d: -time.Second, wantErr: true},
		{name: "over a year", d: Indefinitely + time.Hour, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			until, err := r.Pause(ctx, "api", tc.d, "maintenance")
			if (err != nil) != tc.wantErr {
				t.Fatalf("Pause(%v): got error %v, want error %v", tc.d, err, tc.wantErr)
			}
			u, err := r.Upstream(ctx, "api")
			if err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			if tc.wantErr {
				if u.PausedUntil != nil {
					t.Fatalf("refused pause: got paused until %v, want not paused", u.PausedUntil)
				}
				return
			}
			if u.PausedUntil == nil || u.PauseReason != "maintenance" {
				t.Fatalf("got paused until %v (%q), want paused for maintenance", u.PausedUntil, u.PauseReason)
			}
			if left := u.PausedUntil.Sub(now); left > tc.wantLeft || left < tc.wantLeft-time.Minute {
				t.Errorf("got %v left, want about %v", left, tc.wantLeft)
			}
			if !until.Equal(*u.PausedUntil) {
				t.Errorf("Pause returned %v, status shows %v", until, u.PausedUntil)
			}
			if got := u.UntilResumed(now); got != tc.untilResumed {
				t.Errorf("UntilResumed: got %v, want %v", got, tc.untilResumed)
			}
			if moved, err := r.Resume(ctx, "api"); err != nil || moved != 0 {
				t.Fatalf("Resume: got %d moved, %v; want 0 (no job waited), nil", moved, err)
			}
			if u, _ := r.Upstream(ctx, "api"); u.PausedUntil != nil {
				t.Fatalf("after Resume: got paused until %v, want not paused", u.PausedUntil)
			}
		})
	}
	if _, err := r.Pause(ctx, "nope", time.Minute, ""); !errors.Is(err, queue.ErrUnknownUpstream) {
		t.Errorf("Pause of an unknown upstream: got %v, want ErrUnknownUpstream", err)
	}
	if _, err := r.Resume(ctx, "nope"); !errors.Is(err, queue.ErrUnknownUpstream) {
		t.Errorf("Resume of an unknown upstream: got %v, want ErrUnknownUpstream", err)
	}
}

func TestUntilResumed(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	for _, tc := range []struct {
		until *time.Time
		want  bool
	}{
		{nil, false},
		{at(time.Hour), false},
		{at(299 * 24 * time.Hour), false},
		{at(301 * 24 * time.Hour), true},
		{at(Indefinitely), true},
	} {
		if got := (Upstream{PausedUntil: tc.until}).UntilResumed(now); got != tc.want {
			t.Errorf("paused until %v: got UntilResumed %v, want %v", tc.until, got, tc.want)
		}
	}
}

// A pause placed through asynq's own Inspector is shown as a pause until
// resumed, with its cause, holds the jobs as waiting for it, and is lifted
// by Resume, as asynq's UnpauseQueue would.
func TestAsynqPauseShownAndResumed(t *testing.T) {
	ctx := context.Background()
	rdb := srv.Client(t)
	rdb.FlushAll(ctx)
	q, err := queue.New(rdb, queue.Config{Upstreams: []shaper.Upstream{{Name: "api", Limits: []leaky.Limit{leaky.PerSecond(100)}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	r, err := NewReader(rdb, q, "")
	if err != nil {
		t.Fatal(err)
	}
	job, _, err := q.Enqueue(ctx, &queue.Job{Upstream: "api", Path: "/x"})
	if err != nil {
		t.Fatal(err)
	}
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if err := insp.PauseQueue(jobstore.QueueName("api")); err != nil {
		t.Fatal(err)
	}
	u, err := r.Upstream(ctx, "api")
	if err != nil {
		t.Fatal(err)
	}
	if !u.UntilResumed(time.Now()) || u.PauseReason != AsynqPauseReason || u.TimeToDrainSeconds != nil {
		t.Fatalf("paused through asynq: paused until %v (%q), time to drain %v; want until resumed (%q), none",
			u.PausedUntil, u.PauseReason, u.TimeToDrainSeconds, AsynqPauseReason)
	}
	if u.Scheduled != 1 || u.WaitingFor[queue.WaitingPause] != 1 || u.Backlog.Lanes["default"].Pending != 0 {
		t.Fatalf("paused through asynq: scheduled %d, waiting for %v, lanes %+v; want 1 waiting for the pause",
			u.Scheduled, u.WaitingFor, u.Backlog.Lanes)
	}
	if info, err := q.Get(ctx, job.ID, ""); err != nil || info.State != queue.StateScheduled || info.WaitingFor != queue.WaitingPause {
		t.Fatalf("job: %+v, %v; want scheduled, waiting for the pause", info, err)
	}
	if _, err := r.Resume(ctx, "api"); err != nil {
		t.Fatal(err)
	}
	qi, err := insp.GetQueueInfo(jobstore.QueueName("api"))
	if err != nil || qi.Paused {
		t.Fatalf("asynq's view after Resume: %+v, %v; want not paused", qi, err)
	}
	if u, err = r.Upstream(ctx, "api"); err != nil || u.PausedUntil != nil || u.WaitingFor[queue.WaitingPause] != 0 {
		t.Fatalf("after Resume: paused until %v, waiting for %v, %v; want not paused", u.PausedUntil, u.WaitingFor, err)
	}
	if info, err := q.Get(ctx, job.ID, ""); err != nil || info.State != queue.StateQueued || info.WaitingFor != "" {
		t.Fatalf("job after Resume: %+v, %v; want queued", info, err)
	}
}
