package config

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options builds go-redis options for the configured Redis: a single
// client for a URL, a cluster client for a seed list (even of one node), a
// failover client for sentinel. A non-empty overrideURL — the CLI's --redis
// or SHAPER_REDIS_URL — replaces the whole section except Prefix, so that
// one flag points any config at another Redis.
func (r *Redis) Options(overrideURL string) (*redis.UniversalOptions, error) {
	if overrideURL != "" {
		if err := checkRedisURL(overrideURL); err != nil {
			return nil, fmt.Errorf("redis URL override: %w", err)
		}
		return fromURL(overrideURL)
	}
	switch r.mode() {
	case "cluster":
		return &redis.UniversalOptions{
			Addrs:         r.Cluster,
			IsClusterMode: true,
			Username:      r.Username,
			Password:      r.Password,
			TLSConfig:     r.tlsConfig(),
		}, nil
	case "sentinel":
		return &redis.UniversalOptions{
			Addrs:            r.Sentinel.Addrs,
			MasterName:       r.Sentinel.Master,
			SentinelUsername: r.Sentinel.Username,
			SentinelPassword: r.Sentinel.Password,
			Username:         r.Username,
			Password:         r.Password,
			DB:               r.DB,
			TLSConfig:        r.tlsConfig(),
		}, nil
	}
	raw := r.URL
	if raw == "" {
		raw = defaultRedisURL
	}
	if err := checkRedisURL(raw); err != nil {
		return nil, fmt.Errorf("redis.url: %w", err)
	}
	o, err := fromURL(raw)
	if err != nil {
		return nil, err
	}
	// Credentials written in the URL win; validation refuses a config that
	// gives them in both places.
	o.Username = cmp.Or(o.Username, r.Username)
	o.Password = cmp.Or(o.Password, r.Password)
	return o, nil
}

// NewClient connects to the configured Redis (or overrideURL, as in
// Options). The caller owns the client and closes it. Connecting is lazy:
// an unreachable Redis shows up on the first command.
func (r *Redis) NewClient(overrideURL string) (redis.UniversalClient, error) {
	o, err := r.Options(overrideURL)
	if err != nil {
		return nil, err
	}
	return redis.NewUniversalClient(o), nil
}

// FailFast shortens go-redis's waits for a process that answers producers
// (shaper serve): with the defaults (a 5 s dial tried 5 times, then 3
// retries with backoff) an enqueue against a dead Redis took seconds, while
// a producer must hear 503 within half a second. One dial attempt and one
// retry remain: after a Redis restart pooled connections are dead, and the
// retry on a fresh one is what recovers. Callers' context deadlines reach
// the socket, so the API can bound each call. Values a redis:// URL sets
// itself are kept. Workers keep the defaults: nobody waits on them.
func FailFast(o *redis.UniversalOptions) {
	o.DialTimeout = cmp.Or(o.DialTimeout, 250*time.Millisecond)
	o.DialerRetries = cmp.Or(o.DialerRetries, 1)
	o.MaxRetries = cmp.Or(o.MaxRetries, 1)
	o.ReadTimeout = cmp.Or(o.ReadTimeout, time.Second)
	o.WriteTimeout = cmp.Or(o.WriteTimeout, time.Second)
	o.PoolTimeout = cmp.Or(o.PoolTimeout, 250*time.Millisecond)
	o.ContextTimeoutEnabled = true
}

// fromURL carries everything redis.ParseURL understands over to universal
// options, which have no Network field: a unix socket gets a Dialer.
func fromURL(raw string) (*redis.UniversalOptions, error) {
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, err
	}
	u := &redis.UniversalOptions{
		Addrs:                   []string{o.Addr},
		ClientName:              o.ClientName,
		DB:                      o.DB,
		Protocol:                o.Protocol,
		Username:                o.Username,
		Password:                o.Password,
		MaxRetries:              o.MaxRetries,
		MinRetryBackoff:         o.MinRetryBackoff,
		MaxRetryBackoff:         o.MaxRetryBackoff,
		DialTimeout:             o.DialTimeout,
		ReadTimeout:             o.ReadTimeout,
		WriteTimeout:            o.WriteTimeout,
		PoolFIFO:                o.PoolFIFO,
		PoolSize:                o.PoolSize,
		MaxConcurrentDials:      o.MaxConcurrentDials,
		PoolTimeout:             o.PoolTimeout,
		MinIdleConns:            o.MinIdleConns,
		MaxIdleConns:            o.MaxIdleConns,
		MaxActiveConns:          o.MaxActiveConns,
		ConnMaxIdleTime:         o.ConnMaxIdleTime,
		ConnMaxLifetime:         o.ConnMaxLifetime,
		ConnMaxLifetimeJitter:   o.ConnMaxLifetimeJitter,
		PipelinePoolSize:        o.PipelinePoolSize,
		PipelineReadBufferSize:  o.PipelineReadBufferSize,
		PipelineWriteBufferSize: o.PipelineWriteBufferSize,
		TLSConfig:               o.TLSConfig,
	}
	if o.Network == "unix" {
		path := o.Addr
		u.Dialer = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}
	}
	return u, nil
}

func (r *Redis) tlsConfig() *tls.Config {
	if !r.TLS {
		return nil
	}
	return &tls.Config{MinVersion: tls.VersionTLS12}
}
