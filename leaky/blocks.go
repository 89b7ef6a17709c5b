package leaky

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// ErrBlocked is returned by Wait when the bucket was blocked after the slot
// was booked and the block covers the slot: the slot is not sent. Reserve
// again; the new slot will follow the block.
var ErrBlocked = errors.New("leaky: bucket blocked after the slot was booked")

// blockBoard is a process's copy of every bucket's block, fed by this
// process's own Block calls and by the announcements Watch receives. Slots
// are booked up to MaxWait ahead, so without it a worker would send a slot
// booked before an upstream's 429 even though the upstream asked to pause.
type blockBoard struct {
	mu    sync.Mutex
	until map[string]int64 // bucket -> block end, Redis µs
}

func newBlockBoard() *blockBoard { return &blockBoard{until: map[string]int64{}} }

func (b *blockBoard) set(name string, until int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if until == 0 {
		delete(b.until, name)
		return
	}
	if until > b.until[name] {
		b.until[name] = until
	}
}

// covers reports whether a block of the bucket covers the slot (Redis µs).
func (b *blockBoard) covers(name string, slot int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.until[name] > slot
}

func (p *Pacer) blocksChannel() string { return p.prefix + ":leaky:blocks" }

// BlocksChannel is where blocks and unblocks are announced ("NAME UNTIL",
// UNTIL in Redis µs, 0 for lifted), for processes that react to them.
func (p *Pacer) BlocksChannel() string { return p.blocksChannel() }

// Watch listens for blocks placed by other processes until ctx ends, so
// that Wait holds back slots they cover. Run it in a goroutine you own; it
// needs a client that can Subscribe (Client, ClusterClient, Ring). Missing an
// announcement (a reconnect) only means slots booked before that block are
// sent; every later reservation still honours it.
func (p *Pacer) Watch(ctx context.Context) error {
	sub, ok := p.rdb.(interface {
		Subscribe(ctx context.Context, channels ...string) *redis.PubSub
	})
	if !ok {
		return fmt.Errorf("leaky: client %T cannot subscribe to block announcements", p.rdb)
	}
	ps := sub.Subscribe(ctx, p.blocksChannel())
	defer ps.Close()
	ch := ps.Channel()
	for {
		select {
		case <-ctx.Done():
			return nil
		case msg, ok := <-ch:
			if !ok {
				return nil
			}
			name, until, found := strings.Cut(msg.Payload, " ")
			n, err := strconv.ParseInt(until, 10, 64)
			if !found || err != nil {
				continue
			}
			p.blocks.set(name, n)
		}
	}
}
