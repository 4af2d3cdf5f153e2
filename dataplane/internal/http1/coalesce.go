package http1

import (
	"bufio"
	"io"
	"reflect"
	"unsafe"

	"github.com/valyala/fasthttp"
)

// Body chunks follow bytes, not the sender's framing.
//
// fasthttp's streamed body (requestStream, for a request's body and for an
// upstream response's) returns at most one chunk of the chunked framing
// per Read: 20,000 one-byte chunks sent in one 120 KB write are 20,000
// Reads, and were 20,000 agent events. A chunk for the agents (or for the
// upstream, or the client) now takes, after its first Read, every byte
// already received, up to its size; it never waits for bytes that have
// not arrived, so a body sent slowly still goes on as the sender flushes
// it (reqBody.Pending; the exchange's body reader does the joining).
//
// "Already received" is the connection's bufio.Reader, which the stream
// parses the framing from, and the socket beneath it:
//
//   - Bytes buffered in the reader (Buffered() > 0): the next Read takes
//     them without touching the socket, except when they end inside a
//     piece of framing (a chunk-size line, the CRLF after a chunk's data)
//     whose rest the sender has not sent yet; that Read then waits for
//     the rest, as the stream's own Read of a chunk already did. A sender
//     that flushes whole chunks is never held back.
//   - With the reader empty, bytes waiting in the socket (a MSG_PEEK of
//     one byte that does not block, rawio.Conn.Pending): the Read's one
//     read(2) gets them. Under TLS the socket holds records: a record
//     only partly arrived is waited for, its rest being on its way.
//
// The reader of an upstream response is the upstream call's own
// (dataplane/internal/upstream). The reader of a client's request
// belongs to fasthttp's connection and is
// not exported; it is found in the stream's "reader" field, whose type
// and offset are verified once at start against a stream made over a
// known reader (streamReaderField). Reading a field of a pinned
// dependency this way is a deliberate trade: the alternatives were to
// parse the chunked framing a second time on the bytes the connection
// delivers, or to let a would-block error interrupt the stream's parser,
// which loses its place when the error falls inside a chunk-size line (a
// framing desync, the stuff of request smuggling). Should a fasthttp
// upgrade move the field, the check fails, the request side reads one
// stream Read per chunk again (the response side is unaffected), and
// TestStreamReaderFound says so.

// streamField locates the *bufio.Reader inside fasthttp's body stream.
type streamField struct {
	typ reflect.Type // *fasthttp.requestStream
	off uintptr      // of its reader field
}

var bodyStreamReader = streamReaderField()

// streamReaderField makes a chunked body stream over a reader of its own
// and finds that reader in it: the field named reader, of type
// *bufio.Reader, holding exactly that pointer.
func streamReaderField() streamField {
	var req fasthttp.Request
	req.Header.SetContentLength(-1) // chunked
	br := bufio.NewReader(eofReader{})
	if err := req.ContinueReadBodyStream(br, 0, false); err != nil {
		return streamField{}
	}
	defer func() { _ = req.CloseBodyStream() }()
	stream := req.BodyStream()
	t := reflect.TypeOf(stream)
	if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
		return streamField{}
	}
	f, ok := t.Elem().FieldByName("reader")
	if !ok || f.Type != reflect.TypeFor[*bufio.Reader]() {
		return streamField{}
	}
	sf := streamField{typ: t, off: f.Offset}
	if sf.reader(stream) != br {
		return streamField{}
	}
	return sf
}

// reader is the *bufio.Reader under stream, or nil when stream is not a
// fasthttp body stream (or the field was not found).
func (sf streamField) reader(stream io.Reader) *bufio.Reader {
	if sf.typ == nil || stream == nil || reflect.TypeOf(stream) != sf.typ {
		return nil
	}
	p := reflect.ValueOf(stream).UnsafePointer()
	return *(**bufio.Reader)(unsafe.Add(p, sf.off))
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
