package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/internal/jobstore"
)

// breakdown is where the bytes of one job go: the keys whose MEMORY USAGE
// one enqueue changed on a database that already holds the run's jobs, and
// the fields of the job's task hash.
type breakdown struct {
	name    string
	keys    int // on the database before the enqueue
	changes []change
	kinds   map[string]string
	task    string
	fields  []field
	msg     *jobstore.Message
	msgLen  int
	// perJob is the run's used_memory growth per queued job.
	perJob float64
}

type field struct {
	name  string
	value int
}

// take snapshots every key's size, runs enqueue (one job), snapshots again
// and reads the new task hash.
func (b *breakdown) take(ctx context.Context, rdb *redis.Client, enqueue func() error) error {
	before, err := takeSnapshot(ctx, rdb)
	if err != nil {
		return err
	}
	if err := enqueue(); err != nil {
		return err
	}
	after, err := takeSnapshot(ctx, rdb)
	if err != nil {
		return err
	}
	b.keys, b.changes, b.kinds = len(before), diff(before, after), map[string]string{}
	for _, c := range b.changes {
		if c.After < 0 {
			continue
		}
		if b.kinds[c.Key], err = describe(ctx, rdb, c.Key); err != nil {
			return err
		}
		if c.Before < 0 && strings.Contains(c.Key, "}:t:") {
			b.task = c.Key
		}
	}
	if b.task == "" {
		return fmt.Errorf("the enqueue made no task hash (changed: %v)", b.changes)
	}
	h, err := rdb.HGetAll(ctx, b.task).Result()
	if err != nil {
		return err
	}
	for k, v := range h {
		b.fields = append(b.fields, field{k, len(v)})
		if k == "msg" {
			b.msgLen = len(v)
			if b.msg, err = jobstore.Unmarshal([]byte(v)); err != nil {
				return fmt.Errorf("task %s: msg: %w", b.task, err)
			}
		}
	}
	slices.SortFunc(b.fields, func(x, y field) int { return strings.Compare(x.name, y.name) })
	if b.msg == nil {
		return fmt.Errorf("task %s has no msg field", b.task)
	}
	return nil
}

func (b *breakdown) write(out io.Writer) {
	if b.task == "" {
		return
	}
	fmt.Fprintf(out, "\n#### Where the bytes go: %s (hash-max-listpack-value %d)\n\n", b.name, listpackDefault)
	fmt.Fprintf(out, "Keys whose MEMORY USAGE (SAMPLES 0) one more enqueue changed, on a database of %d keys holding the run's jobs:\n\n", b.keys)
	fmt.Fprintf(out, "| key | type (encoding) | before | after | added |\n| :--- | :--- | ---: | ---: | ---: |\n")
	var sum int64
	for _, c := range b.changes {
		bs, as := fmt.Sprint(c.Before), fmt.Sprint(c.After)
		if c.Before < 0 {
			bs = "(new)"
		}
		if c.After < 0 {
			as = "(gone)"
		}
		fmt.Fprintf(out, "| `%s` | %s | %s | %s | %d B |\n", c.Key, b.kinds[c.Key], bs, as, c.Delta())
		sum += c.Delta()
	}
	fmt.Fprintf(out, "| total | | | | %d B |\n", sum)
	fmt.Fprintf(out, "\nused_memory grew %.0f B per job over the run; the %.0f B more than this total are what one enqueue's MEMORY USAGE does not show, most likely each job's share of bucket arrays that double as they fill (the keyspace's; a large sorted set's) and of the allocator's pages.\n",
		b.perJob, b.perJob-float64(sum))
	fmt.Fprintf(out, "\nIts task hash `%s`: key name %d B; fields and value lengths:\n\n", b.task, len(b.task))
	fmt.Fprintf(out, "| field | name B | value B |\n| :--- | ---: | ---: |\n")
	for _, f := range b.fields {
		fmt.Fprintf(out, "| %s | %d | %d |\n", f.name, len(f.name), f.value)
	}
	m := b.msg
	rest := b.msgLen - len(m.Payload) - len(m.Type) - len(m.ID) - len(m.Queue) - len(m.GroupKey)
	fmt.Fprintf(out, "\nmsg, the protobuf task message, %d B: payload %d B, type %q %d B, ID %d B, queue %d B, group key %q %d B, the rest (tags, lengths, retry %d, timeout %d s, deadline %d, retention %d s) %d B.\n",
		b.msgLen, len(m.Payload), m.Type, len(m.Type), len(m.ID), len(m.Queue), m.GroupKey, len(m.GroupKey),
		m.Retry, m.Timeout, m.Deadline, m.Retention, rest)
	fmt.Fprintf(out, "\nThe payload: `%s`\n", m.Payload)
}
