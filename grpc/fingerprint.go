package idemgrpc

import (
	"encoding/base64"
	"fmt"
	"math"
	"strconv"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// The fingerprint of a call is idempotency.NewJSONFingerprint's over the
// request message written as a JSON object (messageJSON), with
// Method.Fingerprint's field lists and under Method.Route: for the same
// business fields, the fingerprint the HTTP route of the same action
// computes over its JSON body.
//
// Why JSON and a field list, not the message's bytes: a deterministic proto
// encoding is stable only within one version of one encoder, and counts
// fields that are not the action (a trace id, a client's clock); a field
// list names what makes two calls the same order, as the HTTP route's
// allow-list does, and the JSON form lets a key used over HTTP meet the
// same fingerprint over gRPC.
//
// What counts: the populated known fields by their proto names. A proto3
// field without presence at its zero value is not populated, so it counts
// as absent, which an allow-list treats as null. Unknown fields (a newer
// client's) never count: the server cannot act on what it does not know, so
// they cannot make two calls different orders.

// messageJSON writes m's populated fields as a JSON object: proto field
// names, integers of every width as JSON numbers (protojson writes 64-bit
// ones as strings; an HTTP body writes numbers), enums by name, bytes in
// base64, nested messages alike.
func messageJSON(m proto.Message) ([]byte, error) {
	return appendMessage(nil, m.ProtoReflect())
}

func appendMessage(b []byte, m protoreflect.Message) ([]byte, error) {
	b = append(b, '{')
	first := true
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = appendString(b, string(fd.Name()))
		b = append(b, ':')
		b, err = appendField(b, fd, v)
		return err == nil
	})
	if err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

func appendField(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch {
	case fd.IsList():
		list := v.List()
		b = append(b, '[')
		for i := range list.Len() {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendSingular(b, fd, list.Get(i)); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	case fd.IsMap():
		b = append(b, '{')
		first := true
		var err error
		v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
			if !first {
				b = append(b, ',')
			}
			first = false
			b = appendString(b, k.String())
			b = append(b, ':')
			b, err = appendSingular(b, fd.MapValue(), mv)
			return err == nil
		})
		if err != nil {
			return nil, err
		}
		return append(b, '}'), nil
	}
	return appendSingular(b, fd, v)
}

func appendSingular(b []byte, fd protoreflect.FieldDescriptor, v protoreflect.Value) ([]byte, error) {
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return strconv.AppendBool(b, v.Bool()), nil
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind,
		protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return strconv.AppendInt(b, v.Int(), 10), nil
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind, protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return strconv.AppendUint(b, v.Uint(), 10), nil
	case protoreflect.FloatKind, protoreflect.DoubleKind:
		f := v.Float()
		switch {
		case math.IsNaN(f):
			return appendString(b, "NaN"), nil
		case math.IsInf(f, 1):
			return appendString(b, "Infinity"), nil
		case math.IsInf(f, -1):
			return appendString(b, "-Infinity"), nil
		}
		bits := 64
		if fd.Kind() == protoreflect.FloatKind {
			bits = 32
		}
		return strconv.AppendFloat(b, f, 'g', -1, bits), nil
	case protoreflect.StringKind:
		return appendString(b, v.String()), nil
	case protoreflect.BytesKind:
		return appendString(b, base64.StdEncoding.EncodeToString(v.Bytes())), nil
	case protoreflect.EnumKind:
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return appendString(b, string(ev.Name())), nil
		}
		return strconv.AppendInt(b, int64(v.Enum()), 10), nil
	case protoreflect.MessageKind, protoreflect.GroupKind:
		return appendMessage(b, v.Message())
	}
	return nil, fmt.Errorf("field %s: kind %v", fd.FullName(), fd.Kind())
}

// appendString appends s as a JSON string, escaping only what JSON
// requires. Invalid UTF-8 is kept as it is, not replaced: the canonical
// encoding refuses it (a proto2 string may hold it), and the call is
// answered INVALID_MESSAGE, so two different strings never share a
// fingerprint.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
