package config_test

import (
	"fmt"

	"github.com/shaperhq/shaper/config"
)

func ExampleParse() {
	env := map[string]string{"STRIPE_SECRET_KEY": "sk_test_123"}
	c, err := config.Parse([]byte(`
upstreams:
  stripe:
    base_url: https://api.stripe.com
    limits: [{rate: 100, per: 1s}]
    concurrency: 20
    headers: {Authorization: "Bearer ${STRIPE_SECRET_KEY}"}
`), func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Limits("stripe"))
	fmt.Println(c.Upstreams["stripe"].Timeout, c.Upstreams["stripe"].Workers)
	// Output:
	// [100 requests per 1s]
	// 30s 20
}

func ExampleParse_invalid() {
	_, err := config.Parse([]byte(`
upstreams:
  stripe:
    base_url: https://api.stripe.com
    limts: [{rate: 100, per: 1s}]
    timeout: 30
`), nil)
	fmt.Println(err)
	// Output:
	// invalid config (3 problems):
	//   line 4: upstreams.stripe.limits: at least one limit is required (e.g. [{rate: 100, per: 1s}])
	//   line 5: upstreams.stripe.limts: unknown key; did you mean "limits"?
	//   line 6: upstreams.stripe.timeout: 30 has no unit (write 30s, 30ms, 1m, …)
}
