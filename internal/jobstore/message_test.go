package jobstore

import (
	"bytes"
	"context"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/hibiken/asynq"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
)

func TestUnmarshalWhatAsynqWrites(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "mail")
	task := asynq.NewTaskWithHeaders("email:send", []byte(`{"to":"a@b.c"}`), map[string]string{"X-Trace": "t1"})
	if _, err := e.client.EnqueueContext(ctx, task, asynq.TaskID("t-1"), asynq.MaxRetry(7),
		asynq.Retention(2*time.Hour), asynq.Queue("mail"), asynq.Timeout(90*time.Second)); err != nil {
		t.Fatal(err)
	}
	raw, err := e.rdb.HGet(ctx, e.k.Task("t-1"), "msg").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	got, err := Unmarshal(raw)
	if err != nil {
		t.Fatal(err)
	}
	want := &Message{Type: "email:send", Payload: []byte(`{"to":"a@b.c"}`), ID: "t-1", Queue: "mail",
		Retry: 7, Timeout: 90, Retention: 7200, Headers: map[string]string{"X-Trace": "t1"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	// What Marshal writes for it, asynq would have written: same fields in
	// the same order.
	if again := got.Marshal(); !bytes.Equal(again, raw) {
		t.Fatalf("Marshal of the decoded message: got %x, want asynq's %x", again, raw)
	}
}

func TestInspectorReadsWhatMarshalWrites(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, "q1")
	if err := e.rdb.SAdd(ctx, AllQueues, "q1").Err(); err != nil {
		t.Fatal(err)
	}
	failed := time.Unix(1764500000, 0)
	completed := time.Unix(1764500100, 0)
	m := &Message{Type: "call", Payload: []byte{0, 1, 2, 0xff}, ID: "x-9", Queue: "q1", Retry: 8, Retried: 3,
		ErrorMsg: "upstream said 503", LastFailedAt: failed.Unix(), Retention: 3600, CompletedAt: completed.Unix(),
		Headers: map[string]string{"a": "1", "b": ""}}
	if err := e.rdb.HSet(ctx, e.k.Task("x-9"), "msg", m.Marshal(), "state", "completed", "result", "ok!").Err(); err != nil {
		t.Fatal(err)
	}
	if err := e.rdb.ZAdd(ctx, e.k.Completed(), redisZ(completed.Add(time.Hour), "x-9")).Err(); err != nil {
		t.Fatal(err)
	}
	ti, err := e.insp.GetTaskInfo("q1", "x-9")
	if err != nil {
		t.Fatal(err)
	}
	got := []any{ti.ID, ti.Queue, ti.Type, string(ti.Payload), ti.MaxRetry, ti.Retried, ti.LastErr,
		ti.LastFailedAt.Unix(), ti.Retention, ti.CompletedAt.Unix(), string(ti.Result), ti.State, ti.Headers}
	want := []any{"x-9", "q1", "call", "\x00\x01\x02\xff", 8, 3, "upstream said 503",
		failed.Unix(), time.Hour, completed.Unix(), "ok!", asynq.TaskStateCompleted, m.Headers}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestMarshalKeepsStringsReadable(t *testing.T) {
	m := &Message{ID: "a", ErrorMsg: "bad \xff\xfe byte"}
	got, err := Unmarshal(m.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if !utf8.ValidString(got.ErrorMsg) || got.ErrorMsg != "bad \uFFFD byte" {
		t.Fatalf("got %q, want the invalid bytes replaced", got.ErrorMsg)
	}
	// protobuf itself, as asynq uses it, must accept it.
	if err := proto.Unmarshal(m.Marshal(), dynamicpb.NewMessage(taskMessageDesc(t))); err != nil {
		t.Fatalf("protobuf rejects Marshal's output: %v", err)
	}
}

func TestUnmarshalErrors(t *testing.T) {
	for _, b := range [][]byte{
		{0x0a},             // type: length missing
		{0x0a, 0x05, 'a'},  // type: too short
		{0x28},             // retry: varint missing
		{0x7a, 0x02, 0x0a}, // headers entry cut short
		{0x80},             // tag cut short
		{0x00, 0x01},       // field number 0
	} {
		if _, err := Unmarshal(b); err == nil {
			t.Errorf("Unmarshal(%x): got no error", b)
		}
	}
	// An unknown field of every wire type is skipped.
	b := []byte{0xa8, 0x01, 0x05} // field 21 varint
	b = append(b, 0xb2, 0x01, 0x02, 'h', 'i')
	b = append(b, 0xbd, 0x01, 1, 2, 3, 4)
	b = append(b, 0xb9, 0x01, 1, 2, 3, 4, 5, 6, 7, 8)
	b = append(b, (&Message{ID: "z"}).Marshal()...)
	m, err := Unmarshal(b)
	if err != nil || m.ID != "z" {
		t.Fatalf("got %+v, %v, want ID z", m, err)
	}
}

func FuzzMarshalRoundTrip(f *testing.F) {
	f.Add("t", []byte("p"), "id", "q", int32(3), int32(1), "err", int64(30), int64(1764500000), "uk",
		int64(1764500001), int64(3600), int64(1764500002), "g", "k", "v")
	f.Add("", []byte(nil), "", "", int32(-1), int32(-2147483648), "", int64(-1), int64(0), "", int64(0), int64(0), int64(0), "", "", "")
	md := taskMessageDesc(f)
	f.Fuzz(func(t *testing.T, typ string, payload []byte, id, queue string, retry, retried int32, errMsg string,
		timeout, deadline int64, unique string, lastFailed, retention, completedAt int64, group, hk, hv string) {
		m := &Message{Type: typ, Payload: payload, ID: id, Queue: queue, Retry: retry, Retried: retried,
			ErrorMsg: errMsg, Timeout: timeout, Deadline: deadline, UniqueKey: unique, LastFailedAt: lastFailed,
			Retention: retention, CompletedAt: completedAt, GroupKey: group}
		if hk != "" || hv != "" {
			m.Headers = map[string]string{hk: hv, hk + "2": hv}
		}
		enc := m.Marshal()
		got, err := Unmarshal(enc)
		if err != nil {
			t.Fatalf("Unmarshal(Marshal(%+v)): %v", m, err)
		}
		want := sanitized(m)
		if !sameMessage(got, want) {
			t.Fatalf("round trip: got %+v, want %+v", got, want)
		}
		// protobuf, reading asynq's schema, sees the same message.
		dyn := dynamicpb.NewMessage(md)
		if err := proto.Unmarshal(enc, dyn); err != nil {
			t.Fatalf("protobuf rejects Marshal's output: %v", err)
		}
		if fromDyn := fromDynamic(dyn); !sameMessage(fromDyn, want) {
			t.Fatalf("protobuf read %+v, want %+v", fromDyn, want)
		}
		// And what protobuf writes for it, Unmarshal reads.
		pb, err := proto.Marshal(toDynamic(md, want))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := Unmarshal(pb); err != nil || !sameMessage(got, want) {
			t.Fatalf("Unmarshal(protobuf's encoding): got %+v, %v, want %+v", got, err, want)
		}
	})
}

// FuzzUnmarshal holds Unmarshal to protobuf's own decoder on any bytes:
// whatever protobuf decodes, Unmarshal decodes alike.
func FuzzUnmarshal(f *testing.F) {
	f.Add((&Message{Type: "a", ID: "b", Retry: 2, Headers: map[string]string{"x": "y"}}).Marshal())
	f.Add([]byte{0x7a, 0x04, 0x0a, 0x00, 0x12, 0x00, 0x28, 0x80, 0x80, 0x80, 0x80, 0x10})
	f.Add([]byte{0x0d, 1, 2, 3, 4, 0x2a, 0x00})
	md := taskMessageDesc(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Unmarshal(b) // must not panic
		dyn := dynamicpb.NewMessage(md)
		if perr := proto.Unmarshal(b, dyn); perr != nil {
			return // invalid UTF-8 protobuf refuses; Unmarshal may take it
		}
		if err != nil {
			t.Fatalf("protobuf decodes %x, Unmarshal fails: %v", b, err)
		}
		if want := fromDynamic(dyn); !sameMessage(got, want) {
			t.Fatalf("Unmarshal(%x): got %+v, protobuf read %+v", b, got, want)
		}
	})
}

func sanitized(m *Message) *Message {
	c := *m
	for _, s := range []*string{&c.Type, &c.ID, &c.Queue, &c.ErrorMsg, &c.UniqueKey, &c.GroupKey} {
		*s = strings.ToValidUTF8(*s, "\uFFFD")
	}
	if m.Headers != nil {
		c.Headers = make(map[string]string, len(m.Headers))
		for k, v := range m.Headers {
			c.Headers[strings.ToValidUTF8(k, "\uFFFD")] = strings.ToValidUTF8(v, "\uFFFD")
		}
	}
	return &c
}

// sameMessage compares messages as protobuf does: an empty payload or
// header map is the same as none.
func sameMessage(a, b *Message) bool {
	x, y := *a, *b
	if !bytes.Equal(x.Payload, y.Payload) || len(x.Headers) != len(y.Headers) || !maps.Equal(x.Headers, y.Headers) {
		return false
	}
	x.Payload, y.Payload, x.Headers, y.Headers = nil, nil, nil, nil
	return reflect.DeepEqual(x, y)
}

// taskMessageDesc is asynq's TaskMessage (internal/proto/asynq.proto),
// described to protobuf by hand, as an independent reader of the format.
func taskMessageDesc(t testing.TB) protoreflect.MessageDescriptor {
	t.Helper()
	field := func(name string, num int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(num), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum(), JsonName: proto.String(name)}
	}
	str, byt := descriptorpb.FieldDescriptorProto_TYPE_STRING, descriptorpb.FieldDescriptorProto_TYPE_BYTES
	i32, i64 := descriptorpb.FieldDescriptorProto_TYPE_INT32, descriptorpb.FieldDescriptorProto_TYPE_INT64
	headers := field("headers", 15, descriptorpb.FieldDescriptorProto_TYPE_MESSAGE)
	headers.Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
	headers.TypeName = proto.String(".asynqtest.TaskMessage.HeadersEntry")
	fd := &descriptorpb.FileDescriptorProto{
		Name: proto.String("asynqtest.proto"), Package: proto.String("asynqtest"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{
			Name: proto.String("TaskMessage"),
			Field: []*descriptorpb.FieldDescriptorProto{
				field("type", 1, str), field("payload", 2, byt), headers, field("id", 3, str), field("queue", 4, str),
				field("retry", 5, i32), field("retried", 6, i32), field("error_msg", 7, str),
				field("last_failed_at", 11, i64), field("timeout", 8, i64), field("deadline", 9, i64),
				field("unique_key", 10, str), field("group_key", 14, str), field("retention", 12, i64),
				field("completed_at", 13, i64),
			},
			NestedType: []*descriptorpb.DescriptorProto{{
				Name:    proto.String("HeadersEntry"),
				Field:   []*descriptorpb.FieldDescriptorProto{field("key", 1, str), field("value", 2, str)},
				Options: &descriptorpb.MessageOptions{MapEntry: proto.Bool(true)},
			}},
		}},
	}
	file, err := protodesc.NewFile(fd, nil)
	if err != nil {
		t.Fatal(err)
	}
	return file.Messages().ByName("TaskMessage")
}

func fromDynamic(d *dynamicpb.Message) *Message {
	fs := d.Descriptor().Fields()
	get := func(name protoreflect.Name) protoreflect.Value { return d.Get(fs.ByName(name)) }
	m := &Message{
		Type: get("type").String(), Payload: get("payload").Bytes(), ID: get("id").String(), Queue: get("queue").String(),
		Retry: int32(get("retry").Int()), Retried: int32(get("retried").Int()), ErrorMsg: get("error_msg").String(),
		Timeout: get("timeout").Int(), Deadline: get("deadline").Int(), UniqueKey: get("unique_key").String(),
		LastFailedAt: get("last_failed_at").Int(), Retention: get("retention").Int(),
		CompletedAt: get("completed_at").Int(), GroupKey: get("group_key").String(),
	}
	if h := get("headers").Map(); h.Len() > 0 {
		m.Headers = make(map[string]string)
		h.Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			m.Headers[k.String()] = v.String()
			return true
		})
	}
	return m
}

func toDynamic(md protoreflect.MessageDescriptor, m *Message) *dynamicpb.Message {
	d := dynamicpb.NewMessage(md)
	fs := d.Descriptor().Fields()
	set := func(name protoreflect.Name, v protoreflect.Value) { d.Set(fs.ByName(name), v) }
	set("type", protoreflect.ValueOfString(m.Type))
	set("payload", protoreflect.ValueOfBytes(m.Payload))
	set("id", protoreflect.ValueOfString(m.ID))
	set("queue", protoreflect.ValueOfString(m.Queue))
	set("retry", protoreflect.ValueOfInt32(m.Retry))
	set("retried", protoreflect.ValueOfInt32(m.Retried))
	set("error_msg", protoreflect.ValueOfString(m.ErrorMsg))
	set("timeout", protoreflect.ValueOfInt64(m.Timeout))
	set("deadline", protoreflect.ValueOfInt64(m.Deadline))
	set("unique_key", protoreflect.ValueOfString(m.UniqueKey))
	set("last_failed_at", protoreflect.ValueOfInt64(m.LastFailedAt))
	set("retention", protoreflect.ValueOfInt64(m.Retention))
	set("completed_at", protoreflect.ValueOfInt64(m.CompletedAt))
	set("group_key", protoreflect.ValueOfString(m.GroupKey))
	h := d.Mutable(fs.ByName("headers")).Map()
	for k, v := range m.Headers {
		h.Set(protoreflect.ValueOfString(k).MapKey(), protoreflect.ValueOfString(v))
	}
	return d
}
