package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/shaperhq/shaper/bench/internal/fleet"
)

// roleAsynq is the child of this executable that stands for one replica of
// a plain asynq deployment: one asynq.Server per queue, all sharing one
// Redis client, as shaper's replicas share theirs. It runs until SIGTERM.
const roleAsynq = "idle-asynq"

// Child settings, passed in the environment.
const (
	envRedis    = "IDLE_REDIS"
	envQueues   = "IDLE_QUEUES"   // how many queues, one server each
	envInterval = "IDLE_INTERVAL" // TaskCheckInterval; empty for asynq's default
)

func runAsynqChild() error {
	n, err := strconv.Atoi(os.Getenv(envQueues))
	if err != nil || n < 1 {
		return fmt.Errorf("%s: %q", envQueues, os.Getenv(envQueues))
	}
	var interval time.Duration
	if s := os.Getenv(envInterval); s != "" {
		if interval, err = time.ParseDuration(s); err != nil {
			return fmt.Errorf("%s: %w", envInterval, err)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	// Nothing is ever queued; a task reaching the handler is a fault.
	handler := asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		return errors.New("idle benchmark: no task was queued")
	})
	var servers []*asynq.Server
	for i := range n {
		srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{
			Queues:            map[string]int{queueName(i): 1},
			TaskCheckInterval: interval, // zero is asynq's default (1s)
			LogLevel:          asynq.WarnLevel,
		})
		if err := srv.Start(handler); err != nil {
			for _, s := range servers {
				s.Shutdown()
			}
			return err
		}
		servers = append(servers, srv)
	}
	<-ctx.Done()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Go(s.Shutdown)
	}
	wg.Wait()
	return nil
}

// queueName is the i-th upstream's (and asynq queue's) name.
func queueName(i int) string { return fmt.Sprintf("u%04d", i) }

// startAsynq starts one asynq replica with n queues as a child of this
// executable; interval 0 is asynq's default polling.
func startAsynq(name, redisAddr string, n int, interval time.Duration) (*fleet.Proc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), fleet.EnvRole+"="+roleAsynq, envRedis+"="+redisAddr, envQueues+"="+strconv.Itoa(n))
	if interval > 0 {
		cmd.Env = append(cmd.Env, envInterval+"="+interval.String())
	}
	return fleet.Start(name, cmd)
}
