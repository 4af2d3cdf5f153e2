package sdk_test

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// fakeProxy accepts one reverse registration at path and answers it with
// payload_encoding enc; it returns the registration and the connection.
func fakeProxy(t *testing.T, path, enc string) (<-chan protocol.RegistrationRequest, <-chan net.Conn, <-chan *uds.FrameReader) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	reqs, conns, readers := make(chan protocol.RegistrationRequest, 1), make(chan net.Conn, 1), make(chan *uds.FrameReader, 1)
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		t.Cleanup(func() { _ = nc.Close() })
		fr := uds.NewFrameReader(nc)
		_, p, err := fr.Next()
		if err != nil {
			return
		}
		var req protocol.RegistrationRequest
		if protocol.DecodeRegistrationRequest(p, &req) != nil {
			return
		}
		reqs <- req
		if uds.WriteFrame(nc, &protocol.RegistrationResponse{Accepted: true, AssignedID: "conn-1", PayloadEncoding: enc}) != nil {
			return
		}
		conns <- nc
		readers <- fr
	}()
	return reqs, conns, readers
}

// TestReverseAgentSpeaksProtobufWhenTold: the SDK declares the capability,
// and after a RegistrationResponse with payload_encoding "protobuf" it
// decodes protobuf events and answers with protobuf decisions.
func TestReverseAgentSpeaksProtobufWhenTold(t *testing.T) {
	path := testutil.SocketPath(t)
	reqs, conns, readers := fakeProxy(t, path, protocol.EncodingProtobuf)
	serveReverse(t, sdk.ReverseConfig{Address: path, AgentID: "waf-1", Token: "t", BackoffMin: time.Millisecond, BackoffMax: time.Millisecond})
	req, nc, fr := recv(t, reqs), recv(t, conns), recv(t, readers)
	if !req.Capabilities.SupportsProtobufPayloads {
		t.Fatalf("registration capabilities %+v: supports_protobuf_payloads not declared", req.Capabilities)
	}
	ev, err := uds.AppendFrameAs(nil, &protocol.RequestHeaders{RequestID: 77, Method: []byte("GET"), URI: []byte("/x")}, uds.Protobuf)
	if err != nil {
		t.Fatal(err)
	}
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := nc.Write(ev); err != nil {
		t.Fatal(err)
	}
	d, f, typ, ok := nextProtobufDecision(t, fr)
	if !ok || d.RequestID != 77 {
		t.Fatalf("reply %s: not a protobuf Decision for request 77 (%v)", typ, f.Err)
	}
}

// nextProtobufDecision reads the next frame from the agent; ok says it is
// a Decision frame carrying a decodable protobuf Decision, which d is. f
// is the parsed envelope (it aliases fr's buffer until the next read).
func nextProtobufDecision(t *testing.T, fr *uds.FrameReader) (d protocol.Decision, f pbwire.Frame, typ protocol.MsgType, ok bool) {
	t.Helper()
	typ, p, err := fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	f.Parse(p)
	ok = typ == protocol.TypeDecision && f.Err == nil && f.Payload == pbwire.PayloadDecision && f.DecodeDecision(&d) == nil
	return d, f, typ, ok
}

// TestReverseAgentRefusesUndeclaredProtobuf: an agent that keeps JSON and
// is told "protobuf" closes the connection instead of misreading frames.
func TestReverseAgentRefusesUndeclaredProtobuf(t *testing.T) {
	path := testutil.SocketPath(t)
	reqs, conns, readers := fakeProxy(t, path, protocol.EncodingProtobuf)
	registered := make(chan string, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- sdk.DialAndServe(ctx, sdk.ReverseConfig{Address: path, AgentID: "waf-1", Token: "t", JSONPayloads: true,
			BackoffMin: time.Hour, BackoffMax: time.Hour, OnRegistered: func(id string) { registered <- id }},
			sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}})
	}()
	req := recv(t, reqs)
	if req.Capabilities.SupportsProtobufPayloads {
		t.Fatal("JSONPayloads agent declared supports_protobuf_payloads")
	}
	nc, fr := recv(t, conns), recv(t, readers)
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, _, err := fr.Next(); err == nil {
		t.Fatal("agent kept the connection after an encoding it did not declare")
	}
	select {
	case id := <-registered:
		t.Fatalf("agent reported registration %q", id)
	default:
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// recv takes the next value of c, failing the test when the fake proxy
// produced none in time.
func recv[T any](t *testing.T, c <-chan T) T {
	t.Helper()
	select {
	case v := <-c:
		return v
	case <-time.After(10 * time.Second):
		t.Fatal("fake proxy: nothing received")
		panic("unreachable")
	}
}
