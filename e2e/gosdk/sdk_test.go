package gosdk

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stripe/stripe-go/v82"

	"github.com/shaperhq/shaper/fakeupstream"
)

const want = "chunk 1 chunk 2 chunk 3 chunk 4 chunk 5"

// openAIClient is openai-go pointed at shaper's proxy as a user points it:
// the API key is the shaper key, the base URL the proxy, retries off.
func openAIClient(w *world, upstream string, opts ...option.RequestOption) openai.Client {
	return openai.NewClient(append([]option.RequestOption{
		option.WithAPIKey(shaperKey),
		option.WithBaseURL(w.base + "/proxy/" + upstream + "/v1/"),
		option.WithMaxRetries(0),
	}, opts...)...)
}

func chatParams() openai.ChatCompletionNewParams {
	return openai.ChatCompletionNewParams{
		Model:    openai.ChatModelGPT4oMini,
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")},
	}
}

// TestOpenAIGoChatCompletions: openai-go's chat completions, plain and
// streamed, get the upstream's answer through the proxy, the streamed one
// chunk by chunk as the upstream sends it.
func TestOpenAIGoChatCompletions(t *testing.T) {
	t.Parallel()
	const delay = 250 * time.Millisecond
	w := start(t, 0, fakeupstream.VendorOptions{Chunks: 5, ChunkDelay: delay})
	client := openAIClient(w, "openai")
	ctx := context.Background()

	var resp *http.Response
	c, err := client.Chat.Completions.New(ctx, chatParams(), option.WithResponseInto(&resp))
	if err != nil {
		t.Fatalf("chat completion: %v", err)
	}
	if len(c.Choices) != 1 || c.Choices[0].Message.Content != want || c.Usage.TotalTokens == 0 {
		t.Errorf("chat completion %+v, want one choice saying %q and its usage", c, want)
	}
	if qt, err := strconv.ParseFloat(resp.Header.Get("Shaper-Queue-Time"), 64); err != nil || qt < 0 {
		t.Errorf("Shaper-Queue-Time %q, want the seconds waited", resp.Header.Get("Shaper-Queue-Time"))
	}

	stream := client.Chat.Completions.NewStreaming(ctx, chatParams())
	defer stream.Close()
	var text string
	var at []time.Time
	for stream.Next() {
		chunk := stream.Current()
		at = append(at, time.Now())
		if len(chunk.Choices) > 0 {
			text += chunk.Choices[0].Delta.Content
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("streamed chat completion: %v", err)
	}
	if text != want || len(at) != 5 {
		t.Fatalf("streamed %q in %d chunks, want %q in 5", text, len(at), want)
	}
	// Relayed as they come, the first and last chunk arrive 4·delay apart;
	// held to the end, together. Half of that leaves room for a busy host
	// starving shaper for a while.
	if spread := at[len(at)-1].Sub(at[0]); spread < 2*delay {
		t.Errorf("chunks arrived within %v of each other; the upstream sent them %v apart", spread, delay)
	}
	if r := w.fake.Report(); r.Keys[openAISecret].Succeeded != 2 || r.Total != 2 {
		t.Errorf("upstream saw %v, want the 2 calls with the openai secret", r)
	}
	checkUpstreamSaw(t, w.vendor)
}

// TestOpenAIGoSeesShapersRefusals: shaper's own refusals reach openai-go as
// its usual errors: a call whose slot lies beyond its Shaper-Max-Wait is a
// 429 with retry-after-ms (which the SDK's retries read), never sent; an
// unknown upstream a 404; a wrong key a 401.
func TestOpenAIGoSeesShapersRefusals(t *testing.T) {
	t.Parallel()
	w := start(t, 1, fakeupstream.VendorOptions{})
	ctx := context.Background()
	client := openAIClient(w, "openai", option.WithHeader("Shaper-Max-Wait", "0"))
	if _, err := client.Chat.Completions.New(ctx, chatParams()); err != nil {
		t.Fatalf("first call at an idle upstream: %v", err)
	}
	_, err := client.Chat.Completions.New(ctx, chatParams())
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("second call within the second, with no wait: %v, want a 429 *openai.Error", err)
	}
	// The next slot is about a second after the first call's; Retry-After
	// is the same wait in whole seconds, rounded up.
	ms, err := strconv.Atoi(apiErr.Response.Header.Get("Retry-After-Ms"))
	if err != nil || ms <= 0 || ms > 2000 {
		t.Errorf("retry-after-ms %q, want the milliseconds to the next slot (about a second)", apiErr.Response.Header.Get("Retry-After-Ms"))
	} else if s, want := apiErr.Response.Header.Get("Retry-After"), strconv.Itoa((ms+999)/1000); s != want {
		t.Errorf("Retry-After %q with retry-after-ms %d, want %s (seconds, rounded up)", s, ms, want)
	}

	for _, tc := range []struct {
		name   string
		client openai.Client
		status int
	}{
		{"unknown upstream", openAIClient(w, "nope"), http.StatusNotFound},
		{"wrong key", openai.NewClient(option.WithAPIKey("not-a-key"), option.WithBaseURL(w.base+"/proxy/openai/v1/"), option.WithMaxRetries(0)), http.StatusUnauthorized},
	} {
		_, err := tc.client.Chat.Completions.New(ctx, chatParams())
		if !errors.As(err, &apiErr) || apiErr.StatusCode != tc.status {
			t.Errorf("%s: %v, want a %d *openai.Error", tc.name, err, tc.status)
		} else if ct := apiErr.Response.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
			t.Errorf("%s: Content-Type %q, want application/problem+json", tc.name, ct)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the refused call's slot has passed
	if r := w.fake.Report(); r.Total != 1 {
		t.Errorf("upstream saw %v, want only the first call", r)
	}
}

// TestStripeGoCustomersCreate: stripe-go, given the stripe upstream's own
// proxy listener as its backend URL, creates a customer through it.
// (stripe-go v82 refuses an answer to any path not starting with /v1 or
// /v2, so the path form /proxy/stripe is no backend URL for it.)
func TestStripeGoCustomersCreate(t *testing.T) {
	t.Parallel()
	w := start(t, 0, fakeupstream.VendorOptions{})
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(w.stripe),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := stripe.NewClient(shaperKey, stripe.WithBackends(&stripe.Backends{API: backend}))
	params := &stripe.CustomerCreateParams{Email: stripe.String("ada@example.com"), Name: stripe.String("Ada")}
	params.AddMetadata("order", "42")
	c, err := sc.V1Customers.Create(context.Background(), params)
	if err != nil {
		t.Fatalf("customers.create: %v", err)
	}
	if !strings.HasPrefix(c.ID, "cus_") || c.Email != "ada@example.com" || c.Name != "Ada" || c.Metadata["order"] != "42" {
		t.Errorf("customer %+v, want a cus_ id with the email, name and metadata sent", c)
	}
	if r := w.fake.Report(); r.Keys[stripeSecret].Succeeded != 1 || r.Total != 1 {
		t.Errorf("upstream saw %v, want the one call with the stripe secret", r)
	}
	checkUpstreamSaw(t, w.vendor)
}
