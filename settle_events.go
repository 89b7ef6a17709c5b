package shaper

import (
	"bytes"
	"maps"
	"mime"
	"net/http"
	"strings"
)

// SettleEventMaxBytes is the most of one server-sent event an
// EventSettler reads; a longer event is skipped.
const SettleEventMaxBytes = 64 << 10

// IsEventStream says whether h's Content-Type is text/event-stream.
func IsEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// EventSettler reads an answer of server-sent events (the WHATWG HTML
// standard's text/event-stream, as OpenAI streams a chat completion) as it
// passes, keeping only the line and the data of the event being read, each
// capped at SettleEventMaxBytes (a longer event is skipped), and notes the
// amount of each JSON rule in every event whose data, as JSON, has it:
// the last one counts. An event the stream ends in the middle of is not
// read, as the standard has it.
type EventSettler struct {
	rules map[string]Settle
	// keys are the quoted last tokens of the rules' pointers: an event
	// without its rule's key is not decoded.
	keys     map[string][]byte
	line     []byte
	data     []byte
	hasData  bool
	lineOver bool // the line being read outgrew the cap
	over     bool // the event being read is skipped
	lastCR   bool // the last byte was a CR: a LF right after it ends nothing
	found    map[string]int64
}

// NewEventSettler reads the amounts of rules (by cost) from an event
// stream; rules without JSON are left out.
func NewEventSettler(rules map[string]Settle) *EventSettler {
	w := &EventSettler{rules: maps.Clone(rules), keys: map[string][]byte{}, found: map[string]int64{}}
	for cost, rule := range rules {
		if rule.JSON == "" {
			delete(w.rules, cost)
			continue
		}
		i := strings.LastIndexByte(rule.JSON, '/')
		tok := strings.ReplaceAll(strings.ReplaceAll(rule.JSON[i+1:], "~1", "/"), "~0", "~")
		// A key that JSON may spell with escapes is looked for by
		// decoding every event.
		if tok != "" && !strings.ContainsAny(tok, "\"\\/") && isPrintableASCII(tok) {
			w.keys[cost] = []byte(`"` + tok + `"`)
		}
	}
	return w
}

func isPrintableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// Take returns the amounts found since it was last called, the last
// event's for each cost, and forgets them.
func (w *EventSettler) Take() map[string]int64 {
	if len(w.found) == 0 {
		return nil
	}
	out := w.found
	w.found = map[string]int64{}
	return out
}

// Write takes the next bytes of the stream; it never fails.
func (w *EventSettler) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if w.lastCR {
			w.lastCR = false
			if p[0] == '\n' {
				p = p[1:]
				continue
			}
		}
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			w.grow(p)
			break
		}
		w.grow(p[:i])
		w.lastCR = p[i] == '\r'
		p = p[i+1:]
		w.endLine()
	}
	return n, nil
}

func (w *EventSettler) grow(p []byte) {
	if w.lineOver {
		return
	}
	if len(w.line)+len(p) > SettleEventMaxBytes {
		w.lineOver, w.line = true, w.line[:0]
		return
	}
	w.line = append(w.line, p...)
}

// endLine acts on a whole line: a field, or the blank line that ends an
// event. A line over the cap skips its event.
func (w *EventSettler) endLine() {
	line := w.line
	w.line = w.line[:0]
	switch {
	case w.lineOver:
		w.lineOver, w.over = false, true
		return
	case len(line) == 0:
		w.dispatch()
		return
	case w.over:
		return
	}
	field, value, _ := bytes.Cut(line, []byte(":"))
	if string(field) != "data" {
		return
	}
	value = bytes.TrimPrefix(value, []byte(" "))
	if len(w.data)+len(value)+1 > SettleEventMaxBytes {
		w.over = true
		return
	}
	if w.hasData {
		w.data = append(w.data, '\n')
	}
	w.data = append(w.data, value...)
	w.hasData = true
}

// dispatch ends an event: its data, when it is JSON with a rule's
// amount, sets that rule's amount.
func (w *EventSettler) dispatch() {
	data, skip := w.data, w.over
	w.data, w.hasData, w.over = w.data[:0], false, false
	if skip || len(data) == 0 || data[0] != '{' && data[0] != '[' {
		return
	}
	for cost, rule := range w.rules {
		if key, ok := w.keys[cost]; ok && !bytes.Contains(data, key) {
			continue
		}
		if n, ok := rule.Amount(nil, data); ok {
			w.found[cost] = n
		}
	}
}
