package shaper

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
)

func TestSettleAmount(t *testing.T) {
	const openai = `{"id":"c1","usage":{"prompt_tokens":12,"completion_tokens":28,"total_tokens":40},
		"choices":[{"index":0,"usage":{"n":7}},{"index":1,"usage":{"n":9.2}}],
		"a/b":{"m~n":5},"":{"empty":6},"neg":-3,"text":"40","null":null,"frac":0.0001,"big":1e300,"zero":0}`
	cases := []struct {
		name   string
		s      Settle
		header http.Header
		body   string
		want   int64
		wantOK bool
	}{
		{"json total tokens", Settle{JSON: "/usage/total_tokens"}, nil, openai, 40, true},
		{"json through an array", Settle{JSON: "/choices/0/usage/n"}, nil, openai, 7, true},
		{"json float rounds up", Settle{JSON: "/choices/1/usage/n"}, nil, openai, 10, true},
		{"json tiny fraction rounds up to 1", Settle{JSON: "/frac"}, nil, openai, 1, true},
		{"json zero", Settle{JSON: "/zero"}, nil, openai, 0, true},
		{"json ~1 is a slash, ~0 a tilde", Settle{JSON: "/a~1b/m~0n"}, nil, openai, 5, true},
		{"json empty key", Settle{JSON: "//empty"}, nil, openai, 6, true},
		{"json missing key", Settle{JSON: "/usage/cached_tokens"}, nil, openai, 0, false},
		{"json index past the end", Settle{JSON: "/choices/2/usage/n"}, nil, openai, 0, false},
		{"json index with a leading zero", Settle{JSON: "/choices/01/usage/n"}, nil, openai, 0, false},
		{"json index -", Settle{JSON: "/choices/-"}, nil, openai, 0, false},
		{"json index into an object by name", Settle{JSON: "/usage/0"}, nil, openai, 0, false},
		{"json walks past a number", Settle{JSON: "/usage/total_tokens/x"}, nil, openai, 0, false},
		{"json negative", Settle{JSON: "/neg"}, nil, openai, 0, false},
		{"json string is not a number", Settle{JSON: "/text"}, nil, openai, 0, false},
		{"json null", Settle{JSON: "/null"}, nil, openai, 0, false},
		{"json object", Settle{JSON: "/usage"}, nil, openai, 0, false},
		{"json too large", Settle{JSON: "/big"}, nil, openai, 0, false},
		{"json empty body", Settle{JSON: "/usage/total_tokens"}, nil, "", 0, false},
		{"json not JSON", Settle{JSON: "/usage/total_tokens"}, nil, "<html>busy</html>", 0, false},
		{"json top-level array", Settle{JSON: "/1"}, nil, `[5, 6]`, 6, true},
		{"json invalid pointer", Settle{JSON: "usage"}, nil, openai, 0, false},
		{"json bad escape", Settle{JSON: "/a~2b"}, nil, openai, 0, false},

		{"header integer", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"120"}}, "", 120, true},
		{"header any case", Settle{Header: "x-tokens-used"}, http.Header{"X-Tokens-Used": {" 120 "}}, "", 120, true},
		{"header decimal rounds up", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"12.01"}}, "", 13, true},
		{"header exponent", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"1e3"}}, "", 1000, true},
		{"header missing", Settle{Header: "X-Tokens-Used"}, http.Header{}, "", 0, false},
		{"header empty", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {""}}, "", 0, false},
		{"header negative", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"-4"}}, "", 0, false},
		{"header text", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"many"}}, "", 0, false},
		{"header infinity", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"Inf"}}, "", 0, false},
		{"header NaN", Settle{Header: "X-Tokens-Used"}, http.Header{"X-Tokens-Used": {"NaN"}}, "", 0, false},
		{"header ignores the body", Settle{Header: "X-Tokens-Used"}, nil, openai, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := c.s.Amount(c.header, []byte(c.body))
			if got != c.want || ok != c.wantOK {
				t.Errorf("%v.Amount: got %d, %v, want %d, %v", c.s, got, ok, c.want, c.wantOK)
			}
		})
	}
}

func TestSettleValidate(t *testing.T) {
	cases := []struct {
		s    Settle
		want string // "" for valid, else a part of the message
	}{
		{Settle{JSON: "/usage/total_tokens"}, ""},
		{Settle{JSON: "/a~0b/c~1d"}, ""},
		{Settle{JSON: "/"}, ""},
		{Settle{Header: "X-Tokens-Used"}, ""},
		{Settle{}, "set json"},
		{Settle{JSON: "/x", Header: "X-Y"}, "not both"},
		{Settle{JSON: "usage/total_tokens"}, `starts with / (e.g. "/usage/total_tokens")`},
		{Settle{JSON: "/a~b"}, "~ must be followed by 0 (for ~) or 1 (for /)"},
		{Settle{JSON: "/a~"}, "~ must be followed by 0"},
		{Settle{Header: "X Tokens"}, "not a header name"},
		{Settle{Header: "X-Tokens:"}, "not a header name"},
	}
	for _, c := range cases {
		err := c.s.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: got %v, want valid", c.s, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: got %v, want an error containing %q", c.s, err, c.want)
		}
	}
}

func ExampleSettle_Amount() {
	s := Settle{JSON: "/usage/total_tokens"}
	body := []byte(`{"choices": [], "usage": {"prompt_tokens": 31, "total_tokens": 47.5}}`)
	n, ok := s.Amount(nil, body)
	fmt.Println(n, ok)
	// Output: 48 true
}
