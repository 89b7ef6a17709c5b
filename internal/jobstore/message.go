package jobstore

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Message is a task as asynq stores it in the "msg" field of its task hash:
// the fields of asynq's TaskMessage protobuf (internal/proto/asynq.proto in
// asynq v0.26.0), with the same meanings. Times are Unix seconds, zero for
// none; Retry is the most retries asynq would allow (shaper stores a job's
// max_attempts there, see Exhausted), Retried the failed attempts so far.
type Message struct {
	Type         string            // 1
	Payload      []byte            // 2
	ID           string            // 3
	Queue        string            // 4
	Retry        int32             // 5
	Retried      int32             // 6
	ErrorMsg     string            // 7
	Timeout      int64             // 8, seconds, zero for none
	Deadline     int64             // 9
	UniqueKey    string            // 10, the uniqueness lock's key, empty for none
	LastFailedAt int64             // 11
	Retention    int64             // 12, seconds
	CompletedAt  int64             // 13
	GroupKey     string            // 14
	Headers      map[string]string // 15
}

// Field numbers of asynq's TaskMessage.
const (
	fieldType         protowire.Number = 1
	fieldPayload      protowire.Number = 2
	fieldID           protowire.Number = 3
	fieldQueue        protowire.Number = 4
	fieldRetry        protowire.Number = 5
	fieldRetried      protowire.Number = 6
	fieldErrorMsg     protowire.Number = 7
	fieldTimeout      protowire.Number = 8
	fieldDeadline     protowire.Number = 9
	fieldUniqueKey    protowire.Number = 10
	fieldLastFailedAt protowire.Number = 11
	fieldRetention    protowire.Number = 12
	fieldCompletedAt  protowire.Number = 13
	fieldGroupKey     protowire.Number = 14
	fieldHeaders      protowire.Number = 15
)

// Marshal encodes m as protobuf, the way asynq's proto.Marshal would: fields
// in number order, zero values left out, map entries as key=1, value=2
// (sorted by key, so equal messages encode equally).
//
// protobuf's decoder rejects a proto3 string that is not valid UTF-8, and
// then asynq (its Inspector, its server) cannot read the task at all. An
// error message copied from an upstream's reply can hold any bytes, so
// Marshal replaces each invalid sequence in a string field with U+FFFD
// rather than write a task nobody can decode.
func (m *Message) Marshal() []byte {
	b := make([]byte, 0, 64+len(m.Payload)+len(m.ErrorMsg))
	b = appendString(b, fieldType, m.Type)
	if len(m.Payload) > 0 {
		b = protowire.AppendTag(b, fieldPayload, protowire.BytesType)
		b = protowire.AppendBytes(b, m.Payload)
	}
	b = appendString(b, fieldID, m.ID)
	b = appendString(b, fieldQueue, m.Queue)
	// int32 is a varint of the value sign-extended to 64 bits.
	b = appendVarint(b, fieldRetry, uint64(int64(m.Retry)))
	b = appendVarint(b, fieldRetried, uint64(int64(m.Retried)))
	b = appendString(b, fieldErrorMsg, m.ErrorMsg)
	b = appendVarint(b, fieldTimeout, uint64(m.Timeout))
	b = appendVarint(b, fieldDeadline, uint64(m.Deadline))
	b = appendString(b, fieldUniqueKey, m.UniqueKey)
	b = appendVarint(b, fieldLastFailedAt, uint64(m.LastFailedAt))
	b = appendVarint(b, fieldRetention, uint64(m.Retention))
	b = appendVarint(b, fieldCompletedAt, uint64(m.CompletedAt))
	b = appendString(b, fieldGroupKey, m.GroupKey)
	if len(m.Headers) > 0 {
		names := make([]string, 0, len(m.Headers))
		for k := range m.Headers {
			names = append(names, k)
		}
		slices.Sort(names)
		var entry []byte
		for _, k := range names {
			entry = appendString(entry[:0], 1, k)
			entry = appendString(entry, 2, m.Headers[k])
			b = protowire.AppendTag(b, fieldHeaders, protowire.BytesType)
			b = protowire.AppendBytes(b, entry)
		}
	}
	return b
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}

func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.VarintType)
	return protowire.AppendVarint(b, v)
}

// ErrBadMessage is wrapped by Unmarshal's errors: the bytes are not a
// protobuf message.
var ErrBadMessage = errors.New("bad task message")

// Unmarshal decodes a task message written by asynq or by Marshal. Fields
// it does not know (a later asynq's) are skipped, as are known fields sent
// with another wire type, which is what protobuf's own decoder does; a
// field seen twice keeps its last value. Strings are taken as they are,
// valid UTF-8 or not.
func Unmarshal(b []byte) (*Message, error) {
	m := &Message{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, fmt.Errorf("%w: %v", ErrBadMessage, protowire.ParseError(n))
		}
		b = b[n:]
		var used int
		switch {
		case typ == protowire.BytesType && isBytesField(num):
			var v []byte
			v, used = protowire.ConsumeBytes(b)
			if used < 0 {
				break
			}
			switch num {
			case fieldType:
				m.Type = string(v)
			case fieldPayload:
				m.Payload = append([]byte{}, v...)
			case fieldID:
				m.ID = string(v)
			case fieldQueue:
				m.Queue = string(v)
			case fieldErrorMsg:
				m.ErrorMsg = string(v)
			case fieldUniqueKey:
				m.UniqueKey = string(v)
			case fieldGroupKey:
				m.GroupKey = string(v)
			case fieldHeaders:
				k, val, err := unmarshalEntry(v)
				if err != nil {
					return nil, err
				}
				if m.Headers == nil {
					m.Headers = make(map[string]string)
				}
				m.Headers[k] = val
			}
		case typ == protowire.VarintType && isVarintField(num):
			var v uint64
			v, used = protowire.ConsumeVarint(b)
			if used < 0 {
				break
			}
			switch num {
			case fieldRetry:
				m.Retry = int32(v)
			case fieldRetried:
				m.Retried = int32(v)
			case fieldTimeout:
				m.Timeout = int64(v)
			case fieldDeadline:
				m.Deadline = int64(v)
			case fieldLastFailedAt:
				m.LastFailedAt = int64(v)
			case fieldRetention:
				m.Retention = int64(v)
			case fieldCompletedAt:
				m.CompletedAt = int64(v)
			}
		default:
			used = protowire.ConsumeFieldValue(num, typ, b)
		}
		if used < 0 {
			return nil, fmt.Errorf("%w: field %d: %v", ErrBadMessage, num, protowire.ParseError(used))
		}
		b = b[used:]
	}
	return m, nil
}

func isBytesField(num protowire.Number) bool {
	switch num {
	case fieldType, fieldPayload, fieldID, fieldQueue, fieldErrorMsg, fieldUniqueKey, fieldGroupKey, fieldHeaders:
		return true
	}
	return false
}

func isVarintField(num protowire.Number) bool {
	switch num {
	case fieldRetry, fieldRetried, fieldTimeout, fieldDeadline, fieldLastFailedAt, fieldRetention, fieldCompletedAt:
		return true
	}
	return false
}

// unmarshalEntry decodes one headers map entry; a missing key or value is
// the empty string, as in protobuf.
func unmarshalEntry(b []byte) (key, value string, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", fmt.Errorf("%w: headers entry: %v", ErrBadMessage, protowire.ParseError(n))
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == 1 || num == 2) {
			v, used := protowire.ConsumeString(b)
			if used < 0 {
				return "", "", fmt.Errorf("%w: headers entry: %v", ErrBadMessage, protowire.ParseError(used))
			}
			if num == 1 {
				key = v
			} else {
				value = v
			}
			b = b[used:]
			continue
		}
		used := protowire.ConsumeFieldValue(num, typ, b)
		if used < 0 {
			return "", "", fmt.Errorf("%w: headers entry: %v", ErrBadMessage, protowire.ParseError(used))
		}
		b = b[used:]
	}
	return key, value, nil
}
