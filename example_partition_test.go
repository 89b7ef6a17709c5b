package shaper_test

import (
	"fmt"

	"github.com/shaperhq/shaper"
	"github.com/shaperhq/shaper/leaky"
)

// A bulk-email upstream paces each recipient domain on its own: 100 a
// minute per domain, gmail.com 1000, and billing's jobs weigh three times
// any other tenant's when the relay is the bottleneck.
func ExampleUpstream_PartitionLimitsFor() {
	mail := shaper.Upstream{
		Name:               "mail",
		Limits:             []leaky.Limit{leaky.PerSecond(200)},
		PartitionLimits:    []leaky.Limit{leaky.PerMinute(100)},
		PartitionOverrides: map[string][]leaky.Limit{"gmail.com": {leaky.PerMinute(1000)}},
		Fairness:           shaper.Fairness{Weights: map[string]int{"billing": 3}},
	}.WithDefaults()
	for _, p := range []string{"example.org", "gmail.com", ""} {
		fmt.Printf("%q: %v\n", p, mail.PartitionLimitsFor(p))
	}
	fmt.Println("fair by", mail.Fairness.By, "billing", mail.Weight("billing"), "ops", mail.Weight("ops"))
	// Output:
	// "example.org": [100 requests per 1m0s]
	// "gmail.com": [1000 requests per 1m0s]
	// "": []
	// fair by tenant billing 3 ops 1
}
