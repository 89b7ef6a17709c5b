package shaper

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// Settle says where an upstream's answer gives the amount of a cost a job
// really used, so that the estimate the job reserved (its cost) can be
// replaced by it: unused units go back to the limit, an overrun is charged.
// Exactly one of JSON and Header is set.
type Settle struct {
	// JSON is an RFC 6901 JSON pointer into the answer's body, such as
	// "/usage/total_tokens".
	JSON string
	// Header is the name of a response header holding the amount, such as
	// "X-Tokens-Used".
	Header string
}

// String renders the source as in config: "json /usage/total_tokens" or
// "header X-Tokens-Used".
func (s Settle) String() string {
	if s.Header != "" {
		return "header " + s.Header
	}
	return "json " + s.JSON
}

// Validate explains what is wrong with the source, if anything.
func (s Settle) Validate() error {
	switch {
	case s.JSON == "" && s.Header == "":
		return errors.New("set json (a JSON pointer into the body, e.g. /usage/total_tokens) or header (a response header name)")
	case s.JSON != "" && s.Header != "":
		return errors.New("set json or header, not both")
	case s.Header != "":
		if !httpguts.ValidHeaderFieldName(s.Header) {
			return fmt.Errorf("header %q: not a header name (letters, digits and !#$%%&'*+-.^_`|~)", s.Header)
		}
		return nil
	}
	if _, err := pointerTokens(s.JSON); err != nil {
		return err
	}
	return nil
}

// Amount reads the amount the answer reports: from the header, a whole
// number or a decimal rounded up; from the body, the number the pointer
// leads to through objects and arrays, a fraction rounded up. It is false
// when the answer has no such value, the value is not a number, or it is
// negative: the estimate then stands. A body of server-sent events (h's
// Content-Type text/event-stream) is read event by event, and the last
// event whose data has the value gives it (EventSettler).
func (s Settle) Amount(h http.Header, body []byte) (int64, bool) {
	if s.Header != "" {
		v := strings.TrimSpace(h.Get(s.Header))
		if v == "" {
			return 0, false
		}
		return amountOf(json.Number(v))
	}
	tokens, err := pointerTokens(s.JSON)
	if err != nil || len(bytes.TrimSpace(body)) == 0 {
		return 0, false
	}
	if IsEventStream(h) {
		es := NewEventSettler(map[string]Settle{"": s})
		es.Write(body)
		n, ok := es.Take()[""]
		return n, ok
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return 0, false
	}
	for _, tok := range tokens {
		switch v := doc.(type) {
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return 0, false
			}
			doc = next
		case []any:
			i, ok := arrayIndex(tok)
			if !ok || i >= len(v) {
				return 0, false
			}
			doc = v[i]
		default:
			return 0, false
		}
	}
	n, ok := doc.(json.Number)
	if !ok {
		return 0, false
	}
	return amountOf(n)
}

// amountOf reads a non-negative amount, rounding a fraction up: a job that
// used 12.5 units used more than 12.
func amountOf(n json.Number) (int64, bool) {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		if i < 0 {
			return 0, false
		}
		return i, true
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsNaN(f) || f < 0 || f >= math.MaxInt64 {
		return 0, false
	}
	return int64(math.Ceil(f)), true
}

// pointerTokens splits an RFC 6901 pointer into its reference tokens, with
// ~1 and ~0 unescaped. The empty pointer, which means the whole document,
// is refused: an answer's whole body is never just the amount.
func pointerTokens(p string) ([]string, error) {
	switch {
	case p == "":
		return nil, errors.New(`json: empty pointer (want a JSON pointer such as "/usage/total_tokens")`)
	case !strings.HasPrefix(p, "/"):
		return nil, fmt.Errorf("json %q: a JSON pointer starts with / (e.g. %q)", p, "/"+p)
	}
	parts := strings.Split(p[1:], "/")
	for i, part := range parts {
		for j := 0; j < len(part); j++ {
			if part[j] == '~' && (j+1 == len(part) || (part[j+1] != '0' && part[j+1] != '1')) {
				return nil, fmt.Errorf("json %q: ~ must be followed by 0 (for ~) or 1 (for /)", p)
			}
		}
		// RFC 6901 unescapes ~1 before ~0: the other order reads "~01"
		// as "/" instead of "~1".
		parts[i] = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
	}
	return parts, nil
}

// arrayIndex reads an array reference token: 0, or digits without a
// leading zero. "-" (past the end) never holds a value.
func arrayIndex(tok string) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	for _, c := range tok {
		if c < '0' || c > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(tok)
	return i, err == nil
}
