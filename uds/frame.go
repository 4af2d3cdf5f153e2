// Package uds is the binary transport of agent protocol v2 over Unix
// sockets (and, reused by package reverse, over any stream connection):
//
//	| length: u32 big-endian | type: u8 | payload: UTF-8 JSON object |
//
// or, after a handshake (or registration) that negotiated
// protobuf_payloads, a payload that is one AgentMessage of agent.proto in
// protobuf encoding (see Encoding).
//
// length counts the type byte plus the payload, is never 0 and never more
// than 16 MiB; it is checked before anything is allocated. See
// docs/protocol.md for the rules this package follows where the contract is
// silent.
//
// The proxy side of a connection is internal/udsclient's Link (one
// batching writer goroutine and one read loop per connection) under an
// agentmux.Session; its Client dials, handshakes and reconnects a small
// pool of them. The agent side is package sdk.
package uds

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// HeaderSize is the length prefix plus the type byte.
const HeaderSize = 5

// Framing errors. Wrapped with details; test with errors.Is.
var (
	// ErrUDSFrameEmpty: a frame announced length 0.
	ErrUDSFrameEmpty = errors.New("uds: zero-length frame")
	// ErrUDSFrameTooLarge: a frame announced more than the 16 MiB limit.
	ErrUDSFrameTooLarge = errors.New("uds: frame exceeds 16 MiB")
	// ErrUDSUnknownMessage: AppendFrame was given no message, or one that
	// failed to encode.
	ErrUDSUnknownMessage = errors.New("uds: cannot encode message")
	// ErrUDSFrameTimeout: the peer started a frame and did not finish it
	// within the frame timeout.
	ErrUDSFrameTimeout = errors.New("uds: peer stalled mid-frame")
)

// AppendFrame appends one whole frame (header and JSON payload) carrying
// m; the frame's type is m's. It does not allocate when dst has room.
func AppendFrame(dst []byte, m protocol.Message) ([]byte, error) {
	if m == nil {
		return dst, fmt.Errorf("%w: nil message", ErrUDSUnknownMessage)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(m.MsgType()))
	dst, err := m.AppendJSON(dst)
	if err != nil {
		return dst[:start], fmt.Errorf("%w: %s: %v", ErrUDSUnknownMessage, m.MsgType(), err)
	}
	return finishFrame(dst, start)
}

// Encoding is the payload encoding of a connection's frames after its
// handshake or registration (which are always JSON).
type Encoding uint8

const (
	// JSON payloads: UTF-8 JSON objects (the default).
	JSON Encoding = iota
	// Protobuf payloads: each is one AgentMessage of agent.proto (the gRPC
	// transport's stream message: request_id and the one payload field of
	// the frame's type); an agent's error for a request travels as an
	// AgentMessage with agent_error in a Decision frame.
	Protobuf
)

// String is the encoding's name in handshakes, configuration and logs.
func (e Encoding) String() string {
	if e == Protobuf {
		return protocol.EncodingProtobuf
	}
	return protocol.EncodingJSON
}

// AppendFrameAs appends one whole frame carrying m with its payload in
// encoding enc; the frame's type is m's. It does not allocate when dst has
// room.
func AppendFrameAs(dst []byte, m protocol.Message, enc Encoding) ([]byte, error) {
	if enc != Protobuf {
		return AppendFrame(dst, m)
	}
	if m == nil {
		return dst, fmt.Errorf("%w: nil message", ErrUDSUnknownMessage)
	}
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(m.MsgType()))
	dst, err := pbwire.AppendMessage(dst, m)
	if err != nil {
		return dst[:start], fmt.Errorf("%w: %s: %v", ErrUDSUnknownMessage, m.MsgType(), err)
	}
	return finishFrame(dst, start)
}

// AppendRawFrame appends a frame whose payload is already encoded.
func AppendRawFrame(dst []byte, t protocol.MsgType, payload []byte) ([]byte, error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, byte(t))
	dst = append(dst, payload...)
	return finishFrame(dst, start)
}

func finishFrame(dst []byte, start int) ([]byte, error) {
	n := len(dst) - start - 4
	if n > protocol.MaxFrameSize {
		return dst[:start], fmt.Errorf("%w: encoded %d bytes", ErrUDSFrameTooLarge, n)
	}
	binary.BigEndian.PutUint32(dst[start:], uint32(n))
	return dst, nil
}

// WriteFrame encodes m and writes it with one Write call. It allocates
// and is meant for cold paths (handshake, registration).
func WriteFrame(w io.Writer, m protocol.Message) error {
	b, err := AppendFrame(make([]byte, 0, 256), m)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// DefaultReadBufferSize holds most frames whole, so they are decoded
// straight from the read buffer.
const DefaultReadBufferSize = 64 << 10

// DefaultFrameTimeout bounds how long a peer may take to send the rest of
// a frame it has begun (see FrameReader.SetFrameTimeout). Both ends write
// each batch of frames with one Write bounded by their own write timeout
// (5s by default), so a healthy peer has finished a started frame well
// within that, or has given up on the connection itself: on a Unix socket
// the rest follows in microseconds, and 5s still carries a frame of the
// 16 MiB limit over a TCP path of about 30 Mbit/s. It is a third of the
// default 15s ping timeout, which was the only bound on a stalled frame
// before, during which every request on the connection waited.
const DefaultFrameTimeout = 5 * time.Second

// FrameReader reads frames. A frame that fits the read buffer is returned
// as a slice of it (no copy); a larger one is assembled in a scratch buffer
// grown to the announced size, which is checked against the limit first.
type FrameReader struct {
	br  *bufio.Reader
	big []byte
	max int

	// The frame timeout (SetFrameTimeout): dl sets the read deadline of the
	// connection under br; armed says one is set for the current frame.
	src     io.Reader
	dl      readDeadliner
	timeout time.Duration
	armed   bool
}

// readDeadliner is the part of net.Conn the frame timeout needs.
type readDeadliner interface {
	SetReadDeadline(t time.Time) error
}

// NewFrameReader reads frames from r with a DefaultReadBufferSize buffer.
func NewFrameReader(r io.Reader) *FrameReader {
	return NewFrameReaderSize(r, DefaultReadBufferSize)
}

// NewFrameReaderSize reads frames from r with a read buffer of size bytes.
func NewFrameReaderSize(r io.Reader, size int) *FrameReader {
	if size < 4096 {
		size = 4096
	}
	return &FrameReader{br: bufio.NewReaderSize(r, size), max: protocol.MaxFrameSize, src: r}
}

// Buffered is the number of bytes already read from the connection and
// not yet returned by Next: more than zero means the next frame (or part
// of it) is at hand without waiting.
func (fr *FrameReader) Buffered() int { return fr.br.Buffered() }

// SetMaxFrameSize sets the accepted frame length (never above 16 MiB), e.g.
// low for a first frame and back to the limit afterwards.
func (fr *FrameReader) SetMaxFrameSize(n int) {
	if n > 0 && n <= protocol.MaxFrameSize {
		fr.max = n
	}
}

// SetFrameTimeout bounds how long the rest of a frame may take once the
// frame has begun: when a started frame (its header or its payload) needs
// another read from the connection, Next sets a read deadline d from then,
// and clears it when the frame is complete. A peer that stalls mid-frame
// then fails Next with ErrUDSFrameTimeout instead of blocking the
// connection. The wait for a frame's first byte has no deadline (idle
// connections are the ping's business), and a frame already buffered whole
// costs nothing. d <= 0 turns the bound off.
//
// It needs a reader with SetReadDeadline, as a net.Conn has, and does
// nothing on others. Since it clears the read deadline after a frame, no
// other read deadline may be in use on the connection meanwhile: set it
// after the handshake, whose reads have a deadline of their own.
func (fr *FrameReader) SetFrameTimeout(d time.Duration) {
	dl, ok := fr.src.(readDeadliner)
	if !ok || d <= 0 {
		dl, d = nil, 0
	}
	fr.dl, fr.timeout = dl, d
}

// Next returns the next frame's type and payload. The payload is valid
// until the following call. io.EOF means the peer closed between frames;
// io.ErrUnexpectedEOF means it closed inside one.
func (fr *FrameReader) Next() (protocol.MsgType, []byte, error) {
	if fr.timeout > 0 && fr.br.Buffered() < HeaderSize {
		if fr.br.Buffered() == 0 {
			// The frame's first byte: no deadline, however long it takes.
			if _, err := fr.br.Peek(1); err != nil {
				return 0, nil, err
			}
		}
		if fr.br.Buffered() < HeaderSize {
			fr.arm()
		}
	}
	hdr, err := fr.br.Peek(HeaderSize)
	if err != nil {
		return 0, nil, fr.readError(err, fr.br.Buffered(), 0)
	}
	n := int(binary.BigEndian.Uint32(hdr))
	t := protocol.MsgType(hdr[4])
	switch {
	case n == 0:
		fr.disarm()
		return 0, nil, ErrUDSFrameEmpty
	case n > fr.max:
		fr.disarm()
		return 0, nil, fmt.Errorf("%w: announced %d bytes (limit %d)", ErrUDSFrameTooLarge, n, fr.max)
	}
	plen := n - 1
	if HeaderSize+plen <= fr.br.Size() {
		if fr.timeout > 0 && fr.br.Buffered() < HeaderSize+plen {
			fr.arm()
		}
		b, err := fr.br.Peek(HeaderSize + plen)
		if err != nil {
			return 0, nil, fr.readError(err, fr.br.Buffered(), HeaderSize+plen)
		}
		_, _ = fr.br.Discard(HeaderSize + plen)
		fr.disarm()
		return t, b[HeaderSize:], nil
	}
	_, _ = fr.br.Discard(HeaderSize)
	if fr.timeout > 0 {
		fr.arm() // larger than the buffer: more must be read
	}
	if cap(fr.big) < plen {
		fr.big = make([]byte, plen)
	}
	fr.big = fr.big[:plen]
	if got, err := io.ReadFull(fr.br, fr.big); err != nil {
		return 0, nil, fr.readError(err, HeaderSize+got, HeaderSize+plen)
	}
	fr.disarm()
	p := fr.big
	if cap(fr.big) > 4<<20 {
		// Do not pin a huge buffer for the connection's life after one big frame.
		fr.big = nil
	}
	return t, p, nil
}

// arm starts the current frame's deadline, once per frame.
func (fr *FrameReader) arm() {
	if !fr.armed {
		fr.armed = true
		_ = fr.dl.SetReadDeadline(time.Now().Add(fr.timeout))
	}
}

// disarm clears the frame's deadline if one is set.
func (fr *FrameReader) disarm() {
	if fr.armed {
		fr.armed = false
		_ = fr.dl.SetReadDeadline(time.Time{})
	}
}

// readError explains a read that failed inside a frame, when got of its
// want bytes had arrived (want 0: got of the header's).
func (fr *FrameReader) readError(err error, got, want int) error {
	if fr.armed {
		fr.disarm()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			if want == 0 {
				return fmt.Errorf("%w: %d of %d header bytes after %v", ErrUDSFrameTimeout, got, HeaderSize, fr.timeout)
			}
			return fmt.Errorf("%w: %d of %d bytes after %v", ErrUDSFrameTimeout, got, want, fr.timeout)
		}
	}
	if err == io.EOF && got > 0 {
		err = io.ErrUnexpectedEOF
	}
	return err
}
