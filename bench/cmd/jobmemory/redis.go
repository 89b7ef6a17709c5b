package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/redisproc"
)

// settled reads used_memory and the number of keys once the server is
// idle: every other client has gone (the server notices a closed
// connection only when it next polls it, and a client's buffers count in
// used_memory) and used_memory has stopped moving (Redis grows its hash
// tables a step at a time and keeps both the old and the new one until it
// is done).
func settled(srv *redisproc.Server) (used, keys int64, err error) {
	deadline := time.Now().Add(10 * time.Second)
	prev := int64(-1)
	for {
		clients, err := srv.Info("clients")
		if err != nil {
			return 0, 0, err
		}
		used, err = srv.UsedMemory()
		if err != nil {
			return 0, 0, err
		}
		// The one client is the connection that asked.
		if clients["connected_clients"] == "1" && used == prev {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, fmt.Errorf("redis did not settle in 10s: %s clients connected, used_memory %d after %d",
				clients["connected_clients"], used, prev)
		}
		prev = used
		time.Sleep(100 * time.Millisecond)
	}
	space, err := srv.Info("keyspace")
	if err != nil {
		return 0, 0, err
	}
	keys, err = dbKeys(space["db0"])
	return used, keys, err
}

// dbKeys reads the number of keys from INFO keyspace's line for a
// database, "keys=12,expires=0,avg_ttl=0"; an empty line (no keys at all,
// so INFO has no line for it) is zero.
func dbKeys(line string) (int64, error) {
	if line == "" {
		return 0, nil
	}
	for _, f := range strings.Split(line, ",") {
		if v, ok := strings.CutPrefix(f, "keys="); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("INFO keyspace line %q has no keys=", line)
}

// snapshot is every key's MEMORY USAGE, counted exactly (SAMPLES 0: the
// default samples five members of a large hash or set and extrapolates).
type snapshot map[string]int64

func takeSnapshot(ctx context.Context, rdb *redis.Client) (snapshot, error) {
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		return nil, err
	}
	cmds := make([]*redis.Cmd, len(keys))
	_, err = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			cmds[i] = p.Do(ctx, "MEMORY", "USAGE", k, "SAMPLES", "0")
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s := snapshot{}
	for i, k := range keys {
		n, err := cmds[i].Int64()
		if err != nil {
			return nil, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		s[k] = n
	}
	return s, nil
}

// change is one key whose MEMORY USAGE differs between two snapshots;
// Before is -1 for a key that is new, After -1 for one that has gone.
type change struct {
	Key           string
	Before, After int64
}

// Delta is what the change added to the key's memory.
func (c change) Delta() int64 { return max(c.After, 0) - max(c.Before, 0) }

// diff lists the keys that appeared, went or changed in size from before
// to after, sorted by key.
func diff(before, after snapshot) []change {
	var out []change
	for k, a := range after {
		b, ok := before[k]
		if !ok {
			b = -1
		}
		if a != b {
			out = append(out, change{Key: k, Before: b, After: a})
		}
	}
	for k, b := range before {
		if _, ok := after[k]; !ok {
			out = append(out, change{Key: k, Before: b, After: -1})
		}
	}
	slices.SortFunc(out, func(x, y change) int { return strings.Compare(x.Key, y.Key) })
	return out
}

// describe is a key's type and encoding, "hash (listpack)".
func describe(ctx context.Context, rdb *redis.Client, key string) (string, error) {
	typ, err := rdb.Type(ctx, key).Result()
	if err != nil {
		return "", err
	}
	enc, err := rdb.ObjectEncoding(ctx, key).Result()
	if err != nil {
		return "", err
	}
	return typ + " (" + enc + ")", nil
}

// sampleTask finds one task hash of queue and returns its name, its type
// and encoding and its MEMORY USAGE.
func sampleTask(ctx context.Context, rdb *redis.Client, queue string) (key, kind string, usage int64, err error) {
	keys, _, err := rdb.Scan(ctx, 0, "asynq:{"+queue+"}:t:*", 1000).Result()
	if err != nil {
		return "", "", 0, err
	}
	if len(keys) == 0 {
		return "", "", 0, fmt.Errorf("no task hash of queue %s", queue)
	}
	key = keys[0]
	if kind, err = describe(ctx, rdb, key); err != nil {
		return "", "", 0, err
	}
	usage, err = rdb.Do(ctx, "MEMORY", "USAGE", key, "SAMPLES", "0").Int64()
	return key, kind, usage, err
}
