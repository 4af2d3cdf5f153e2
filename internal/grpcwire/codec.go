package grpcwire

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Sentinel errors of the gRPC transport. Wrapped with details; test with
// errors.Is.
var (
	// ErrGRPCMessageTooLarge: a message exceeds the 10 MiB gRPC limit.
	ErrGRPCMessageTooLarge = errors.New("grpcwire: message too large")
	// ErrGRPCMessageType: a message of a type this transport does not carry
	// (the wire format's pbwire.ErrMessageType).
	ErrGRPCMessageType = pbwire.ErrMessageType
	// ErrGRPCMalformed: a stream message that is not a valid AgentMessage
	// (the wire format's pbwire.ErrMalformed).
	ErrGRPCMalformed = pbwire.ErrMalformed
	// ErrGRPCAgentError: the agent reported that it failed to handle an event.
	ErrGRPCAgentError = errors.New("grpcwire: agent error")
	// ErrGRPCClosed: the stream or client was closed.
	ErrGRPCClosed = errors.New("grpcwire: closed")
	// ErrGRPCQueueFull: the stream's send queue is full (the peer does not read).
	ErrGRPCQueueFull = errors.New("grpcwire: send queue full")
)

// MaxMessageSize is the largest gRPC message in either direction.
const MaxMessageSize = protocol.MaxGRPCMessageSize

// WindowSize is the HTTP/2 flow-control window, per stream and per
// connection, that both ends of the transport set. A fixed window turns
// off grpc-go's bandwidth-delay estimation, which otherwise answers every
// received data frame of a quiet connection with a PING and a window
// update (two more frames and a dozen allocations per round trip with one
// request in flight). 4 MiB lets one stream carry about 200 MB/s over a
// 20 ms round trip, and bounds what a peer can have in flight unread.
const WindowSize = 4 << 20

// Codec returns the gRPC codec of this transport. It is named "proto" and
// is a superset of gRPC's protobuf codec: any proto.Message goes through
// the standard codec, while *Outgoing (an AgentMessage already encoded by
// Outgoing.Encode) and *Frame (an AgentMessage decoded without the
// generated types, keeping the request id of a malformed one) get the fast
// paths. Both ends of ProcessStream use it: the proxy passes
// grpc.ForceCodecV2(Codec()) on the stream, the agent side
// grpc.ForceServerCodecV2(Codec()).
func Codec() encoding.CodecV2 { return theCodec }

var theCodec = &codec{std: encoding.GetCodecV2(grpcproto.Name)}

type codec struct{ std encoding.CodecV2 }

func (c *codec) Name() string { return grpcproto.Name }

func (c *codec) Marshal(v any) (mem.BufferSlice, error) {
	if o, ok := v.(*Outgoing); ok {
		b, sb := o.buf, o.small
		o.buf, o.small = nil, nil
		if b == nil {
			return nil, fmt.Errorf("%w: empty outgoing message", ErrGRPCMessageType)
		}
		if sb != nil {
			// The one-element slice lives with the pooled bytes: no
			// allocation. gRPC reads it until it frees the buffer, which
			// hands both back to the pool together.
			sb.bs[0] = b
			return sb.bs[:], nil
		}
		return mem.BufferSlice{b}, nil
	}
	return c.std.Marshal(v)
}

func (c *codec) Unmarshal(data mem.BufferSlice, v any) error {
	switch f := v.(type) {
	case *Frame:
		// One allocation per message: the decoded fields alias it, so it
		// must not be reused while a handler or waiter holds them.
		f.Parse(data.Materialize())
	case *FrameInto:
		n := data.Len()
		if cap(f.Buf) < n {
			f.Buf = make([]byte, n, max(n, 512))
		}
		f.Buf = f.Buf[:n]
		data.CopyTo(f.Buf)
		f.Parse(f.Buf)
	default:
		return c.std.Unmarshal(data, v)
	}
	// A malformed message fails its own request only, never the stream.
	return nil
}

// FrameInto is a Frame received into a buffer the caller provides: the
// message is copied into Buf (grown when too small) instead of a fresh
// allocation, and the decoded fields alias Buf. The caller must not
// receive into the same Buf again while they are in use: the proxy keeps
// each Buf with the reply decoded from it (agentmux.Reply.Buf).
type FrameInto struct {
	Frame
	Buf []byte
}

// Outgoing is one encoded AgentMessage on its way to SendMsg. The codec
// takes its buffer (gRPC frees it once written).
type Outgoing struct {
	buf   mem.Buffer
	small *smallBuf // buf's pooled storage, when it came from smallBufs
}

// Len is the encoded size in bytes.
func (o *Outgoing) Len() int {
	if o.buf == nil {
		return 0
	}
	return o.buf.Len()
}

// Free releases a message that will not be sent.
func (o *Outgoing) Free() {
	if o.buf != nil {
		o.buf.Free()
		o.buf, o.small = nil, nil
	}
}

// Encode encodes the AgentMessage carrying msg into o, refusing one larger
// than limit bytes (MaxMessageSize when limit <= 0). msg may be reused
// once Encode returns.
func (o *Outgoing) Encode(msg protocol.Message, limit int) error {
	if limit <= 0 || limit > MaxMessageSize {
		limit = MaxMessageSize
	}
	w, err := pbwire.Resolve(msg)
	if err != nil {
		return err
	}
	size := w.Size()
	if size > limit {
		return fmt.Errorf("%w: %s of %d bytes exceeds the limit of %d bytes", ErrGRPCMessageTooLarge, w.Type(), size, limit)
	}
	o.Free()
	if size <= smallBufSize {
		sb := smallBufs.get(size)
		sb.b = w.Append(sb.b[:0])
		o.buf, o.small = mem.NewBuffer(&sb.b, &smallBufs), sb
		return nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = w.Append((*buf)[:0])
	o.buf = mem.NewBuffer(buf, pool)
	return nil
}

// smallBufSize is the capacity of the pooled buffers of typical messages:
// above gRPC's pooling threshold, so that mem.NewBuffer hands them back to
// smallBufs once gRPC has written them.
const smallBufSize = 2048

// smallBufs recycles encode buffers without zeroing them: every byte that
// is read was just written.
var smallBufs smallPool

type smallPool struct{ p sync.Pool }

// smallBuf is the pooled storage of a small message: its bytes, and the
// one-element mem.BufferSlice that Marshal hands to gRPC. b comes first:
// the *[]byte gRPC gives back to Put points at the whole smallBuf.
type smallBuf struct {
	b  []byte
	bs [1]mem.Buffer
}

func (s *smallPool) get(n int) *smallBuf {
	if v := s.p.Get(); v != nil {
		sb := v.(*smallBuf)
		sb.b = sb.b[:n]
		return sb
	}
	return &smallBuf{b: make([]byte, n, smallBufSize)}
}

// Get implements mem.BufferPool (gRPC does not call it on this pool).
func (s *smallPool) Get(n int) *[]byte { return &s.get(n).b }

// Put implements mem.BufferPool: gRPC calls it once the buffer made by
// Encode is written (or freed unsent).
func (s *smallPool) Put(b *[]byte) {
	if cap(*b) != smallBufSize {
		return
	}
	sb := (*smallBuf)(unsafe.Pointer(b))
	sb.bs[0] = nil
	s.p.Put(sb)
}

// EncodeAgentError encodes an agent error for request id into o.
func (o *Outgoing) EncodeAgentError(id uint64, reason string) {
	o.Free()
	o.buf = mem.SliceBuffer(AppendAgentError(make([]byte, 0, 32+len(reason)), id, reason))
}
