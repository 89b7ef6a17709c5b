package queue

import (
	"bytes"
	"testing"
	"time"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// SucceededJobMessage keeps what SucceededMessage keeps, from the job
// already decoded, and leaves out headers put back for the send.
func TestSucceededJobMessageMatchesSucceededMessage(t *testing.T) {
	now := time.Unix(1_700_000_000, 123)
	for _, j := range []Job{
		{ID: "a", Upstream: "u", Lane: "l", Method: "POST", Path: "/x", Body: []byte(`{"n":1}`),
			Headers: map[string]string{"X-A": "1"}, Secrets: "s1", MaxAttempts: 3, CreatedAt: now,
			IdempotencyKey: "k", CallbackURL: "http://cb/"},
		{ID: "b", Upstream: "u", Body: []byte{0xff, 0x00}, IdempotencyKey: "b"},
		{ID: "c", Upstream: "u", Path: "/nothing-to-leave-out", IdempotencyKey: "c"},
	} {
		payload, err := EncodeJob(&j)
		if err != nil {
			t.Fatal(err)
		}
		msg := &jobstore.Message{Type: TaskType, ID: j.ID, Queue: "q", Payload: payload}
		decoded, err := DecodeJob(j.ID, payload)
		if err != nil {
			t.Fatal(err)
		}
		stored := decoded
		// What the send does to the job after the copy: it must not count.
		decoded.Headers = map[string]string{"Authorization": "secret"}
		want := SucceededMessage(msg)
		got := SucceededJobMessage(msg, &stored)
		if !bytes.Equal(got.Payload, want.Payload) {
			t.Errorf("job %s: payload %s, want %s", j.ID, got.Payload, want.Payload)
		}
		if bytes.Contains(got.Payload, []byte("secret")) {
			t.Errorf("job %s: kept a header put back for the send: %s", j.ID, got.Payload)
		}
	}
}
