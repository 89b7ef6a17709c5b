package config

import (
	"fmt"
	"strings"
	"time"
)

// Duration is a time.Duration written in Go syntax in the config: 500ms,
// 1s, 1m, 6m0s, 1h30m. A bare number is refused rather than guessed at
// (seconds? milliseconds?), so "timeout: 30" is an error that says to write
// 30s. It marshals back to the same syntax for JSON and YAML output.
type Duration time.Duration

// String is Go's spelling of the duration, e.g. "1m0s".
func (d Duration) String() string { return time.Duration(d).String() }

// MarshalText writes the duration as String does.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// UnmarshalText reads a duration with the same rules as the config.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := parseDuration(string(b))
	if err != nil {
		return err
	}
	*d = v
	return nil
}

func parseDuration(s string) (Duration, error) {
	if bareNumber.MatchString(s) {
		return 0, fmt.Errorf("%s has no unit (write %ss, %sms, 1m, …)", s, s, s)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		if num, ok := strings.CutSuffix(s, "d"); ok {
			if bareNumber.MatchString(num) {
				return 0, fmt.Errorf("%q: there is no d unit (write days in hours, e.g. 168h for 7d)", s)
			}
		}
		return 0, fmt.Errorf("%q is not a duration (write 500ms, 1s, 1m, 1h30m, …)", s)
	}
	return Duration(v), nil
}
