// Package machine describes the host a benchmark ran on, for the line under
// each table: figures from a shared 2-core machine mean little without its
// core count and how busy it was.
package machine

import (
	"fmt"
	"os"
	"runtime"
	"strings"
)

// Describe names the CPUs, Go and the Redis server: "2 CPUs (GOMAXPROCS 2),
// go1.26.8 linux/amd64, Redis 7.0.15".
func Describe(redisVersion string) string {
	return fmt.Sprintf("%d CPUs (GOMAXPROCS %d), %s %s/%s, %s",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), runtime.GOOS, runtime.GOARCH, redisVersion)
}

// Load is the load average over 1, 5 and 15 minutes as uptime prints it,
// or "unknown" where /proc/loadavg cannot be read.
func Load() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], ", ")
}
