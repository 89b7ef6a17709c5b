package client

import (
	"context"
	"time"
)

// SetTime gives a test control of c's clock and waits, so retries and polls
// can be driven without sleeping.
func SetTime(c *Client, now func() time.Time, sleep func(context.Context, time.Duration) error) {
	if now != nil {
		c.now = now
	}
	if sleep != nil {
		c.sleep = sleep
	}
}
