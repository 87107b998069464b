package idemgrpc

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// A response message is recorded as the HTTP route of the same action
// answers (answerJSON), so that a replay over HTTP of an answer recorded
// over gRPC is that route's answer, whichever transport made it:
//
//   - proto field names, in the message's field order;
//   - every known field present: a field without presence at its zero
//     value is written (0, "", false, [], {}), a field with presence (proto3
//     optional, a message field, a oneof member) that is unset is null, as
//     encoding/json writes a nil pointer;
//   - integers of every width as JSON numbers (protojson writes 64-bit ones
//     as strings; an HTTP handler's encoding/json writes numbers);
//   - strings as encoding/json escapes them, enums by name, bytes in
//     base64, NaN and infinities as protojson's strings;
//   - well-known types (Timestamp, Duration, Struct, wrappers, ...) in
//     protojson's form, but Int64Value and UInt64Value as numbers;
//   - a final newline, as json.Encoder writes;
//   - extensions and unknown fields left out: they are no HTTP route's.
//
// A replay over gRPC decodes it back with protojson, which reads numbers
// into 64-bit fields, skips nulls and ignores unknown fields. One exception
// to null: an unset google.protobuf.Value (or NullValue) field is left out,
// since protojson reads null into it as a set null value.

// answerJSON writes m as the HTTP route's JSON answer.
func answerJSON(m proto.Message) ([]byte, error) {
	b, err := appendAnswerMessage(nil, m.ProtoReflect())
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

func appendAnswerMessage(b []byte, m protoreflect.Message) ([]byte, error) {
	if wellKnown(m.Descriptor()) {
		return appendWellKnown(b, m)
	}
	b = append(b, '{')
	fields := m.Descriptor().Fields()
	first := true
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.HasPresence() && !m.Has(fd) && nullIsAValue(fd) {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendJSONString(b, fd.TextName())
		b = append(b, ':')
		var err error
		switch {
		case fd.HasPresence() && !m.Has(fd):
			b = append(b, "null"...)
		case fd.IsList():
			b, err = appendAnswerList(b, fd, m.Get(fd).List())
		case fd.IsMap():
			b, err = appendAnswerMap(b, fd, m.Get(fd).Map())
		default:
			b, err = appendAnswerValue(b, fd, m.Get(fd))
		}
		if err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendAnswerList(b []byte, fd protoreflect.FieldDescriptor, list protoreflect.List) ([]byte, error) {
	b = append(b, '[')
	for i := range list.Len() {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = appendAnswerValue(b, fd, list.Get(i)); err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}

// appendAnswerMap writes a map with its keys in order, so that one answer
// is always the same bytes.
func appendAnswerMap(b []byte, fd protoreflect.FieldDescriptor, mp protoreflect.Map) ([]byte, error) {
	keys := make([]protoreflect.MapKey, 0, mp.Len())
	mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
		keys = append(keys, k)
		return true
	})
	slices.SortFunc(keys, func(x, y protoreflect.MapKey) int {
		switch v := x.Interface().(type) {
		case bool:
			return cmp.Compare(boolRank(v), boolRank(y.Bool()))
		case string:
			return cmp.Compare(v, y.String())
		case uint32, uint64:
			return cmp.Compare(x.Uint(), y.Uint())
		default:
			return cmp.Compare(x.Int(), y.Int())
		}
	})
	b = append(b, '{')
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendJSONString(b, k.String())
		b = append(b, ':')
		var err error
		if b, err = appendAnswerValue(b, fd.MapValue(), mp.Get(k)); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func boolRank(v bool) int {
	if v {
		return 1
	}
	return 0
}

func appendAnswerValue(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return strconv.AppendBool(b, v.Bool()), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return strconv.AppendInt(b, v.Int(), 10), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.AppendUint(b, v.Uint(), 10), nil
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		return appendFloat(b, v.Float(), fd.Kind() == protoreflect.FloatKind)
	case protoreflect.StringKind:
		return appendJSONString(b, v.String()), nil
	case protoreflect.BytesKind:
		return appendJSONString(b, base64.StdEncoding.EncodeToString(v.Bytes())), nil
	case protoreflect.EnumKind:
		if fd.Enum().FullName() == "google.protobuf.NullValue" {
			return append(b, "null"...), nil
		}
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return appendJSONString(b, string(ev.Name())), nil
		}
		return strconv.AppendInt(b, int64(v.Enum()), 10), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return appendAnswerMessage(b, v.Message())
	}
	return nil, fmt.Errorf("field %s: kind %v", fd.FullName(), fd.Kind())
}

// appendFloat writes f as encoding/json does, and NaN and the infinities,
// which JSON has no number for, as protojson's strings.
func appendFloat(b []byte, f float64, float32Kind bool) ([]byte, error) {
	switch {
	case math.IsNaN(f):
		return appendJSONString(b, "NaN"), nil
	case math.IsInf(f, 1):
		return appendJSONString(b, "Infinity"), nil
	case math.IsInf(f, -1):
		return appendJSONString(b, "-Infinity"), nil
	}
	var v any = f
	if float32Kind {
		v = float32(f)
	}
	enc, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return append(b, enc...), nil
}

// appendJSONString writes s as encoding/json does.
func appendJSONString(b []byte, s string) []byte {
	enc, _ := json.Marshal(s) // a string always marshals
	return append(b, enc...)
}

// nullIsAValue reports whether protojson reads null into fd as a value (a
// google.protobuf.Value, a NullValue), not as "unset": such a field is left
// out when unset.
func nullIsAValue(fd protoreflect.FieldDescriptor) bool {
	switch {
	case fd.Message() != nil:
		return fd.Message().FullName() == "google.protobuf.Value"
	case fd.Enum() != nil:
		return fd.Enum().FullName() == "google.protobuf.NullValue"
	}
	return false
}

// wellKnown reports whether protojson writes md in a form of its own.
func wellKnown(md protoreflect.MessageDescriptor) bool {
	switch md.FullName() {
	case "google.protobuf.Any", "google.protobuf.Timestamp", "google.protobuf.Duration",
		"google.protobuf.FieldMask", "google.protobuf.Struct", "google.protobuf.Value",
		"google.protobuf.ListValue", "google.protobuf.Empty",
		"google.protobuf.DoubleValue", "google.protobuf.FloatValue", "google.protobuf.Int64Value",
		"google.protobuf.UInt64Value", "google.protobuf.Int32Value", "google.protobuf.UInt32Value",
		"google.protobuf.BoolValue", "google.protobuf.StringValue", "google.protobuf.BytesValue":
		return true
	}
	return false
}

// wellKnownJSON writes a well-known type in protojson's special form.
var wellKnownJSON = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

func appendWellKnown(b []byte, m protoreflect.Message) ([]byte, error) {
	switch m.Descriptor().FullName() {
	case "google.protobuf.Int64Value", "google.protobuf.UInt64Value":
		fd := m.Descriptor().Fields().ByName("value")
		return appendAnswerValue(b, fd, m.Get(fd))
	}
	enc, err := wellKnownJSON.Marshal(m.Interface())
	if err != nil {
		return nil, err
	}
	// protojson varies its whitespace on purpose; the record is compact.
	var buf bytes.Buffer
	if err := json.Compact(&buf, enc); err != nil {
		return nil, err
	}
	return append(b, buf.Bytes()...), nil
}
