package schedule_test

import (
	"fmt"
	"time"

	"github.com/shaperhq/shaper/schedule"
)

// A daily 02:30 in Berlin across the fall-back day runs once on it.
func ExampleParseCron() {
	loc, _ := schedule.LoadZone("Europe/Berlin")
	sp, err := schedule.ParseCron("30 2 * * *", loc)
	if err != nil {
		panic(err)
	}
	t := time.Date(2026, 10, 24, 12, 0, 0, 0, loc)
	for range 3 {
		t = sp.Next(t)
		fmt.Println(t.Format("2006-01-02 15:04 MST"))
	}
	// Output:
	// 2026-10-25 02:30 CEST
	// 2026-10-26 02:30 CET
	// 2026-10-27 02:30 CET
}

// Each run's idempotency key names its schedule and tick.
func ExampleSchedule_Key() {
	s := schedule.Schedule{Name: "nightly-report"}
	fmt.Println(s.Key(time.Unix(1792888200, 0)))
	// Output: schedule:nightly-report:1792888200
}
