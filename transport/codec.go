package transport

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec Codec falls back on
	"google.golang.org/grpc/mem"
)

// vtMessage is a message with vtprotobuf's generated marshalling:
// go-control-plane's Envoy messages (RLS among them) built with
// -tags vtprotobuf.
type vtMessage interface {
	SizeVT() int
	MarshalToSizedBufferVTStrict(buf []byte) (int, error)
}

// Codec returns gRPC's protobuf codec, except that it marshals a message
// with vtprotobuf's generated code by that code: an RLS answer in a
// third of the time protobuf's reflection takes (docs/benchmarks.md).
// Built without -tags vtprotobuf, no message has that code, and Codec is
// gRPC's codec. Unmarshalling is always gRPC's (go-control-plane
// generates none).
func Codec() encoding.CodecV2 {
	return codec{encoding.GetCodecV2("proto")}
}

type codec struct{ encoding.CodecV2 }

// VTMarshals says whether Codec marshals Envoy's RLS messages with
// vtprotobuf's code: whether the binary was built with -tags vtprotobuf.
func VTMarshals() bool {
	_, ok := any(new(rlsv3.RateLimitResponse)).(vtMessage)
	return ok
}

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(vtMessage)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	size := m.SizeVT()
	if mem.IsBelowBufferPoolingThreshold(size) {
		buf := make([]byte, size)
		if err := marshalVT(m, buf); err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(buf)}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	if err := marshalVT(m, (*buf)[:size]); err != nil {
		pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// marshalVT marshals m into buf, which SizeVT sized: the code writes from
// the end backwards, so a message that came out shorter (changed between
// the two calls) would leave zeros first. That is an error, not a frame.
func marshalVT(m vtMessage, buf []byte) error {
	n, err := m.MarshalToSizedBufferVTStrict(buf)
	if err == nil && n != len(buf) {
		err = fmt.Errorf("marshalled %d bytes of the %d it was sized at", n, len(buf))
	}
	if err != nil {
		return fmt.Errorf("proto: marshal %T: %w", m, err)
	}
	return nil
}
