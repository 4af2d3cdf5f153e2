// Command brokenagent is an agent of protocol v2 that breaks one rule on
// purpose (-mode), so that the tests of package agentcheck prove each check
// can fail. With -mode good it breaks none. -mode answerall answers every
// frame it cannot use (an unknown type, a misdirected frame, an event that
// does not decode) with an unrequested {"request_id":0,"decision":"allow"},
// as a third-party SDK was seen to do.
//
//	brokenagent -mode wrongpong -socket /tmp/a.sock
//	brokenagent -mode nobackoff -reverse /tmp/proxy.sock
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

var mode = flag.String("mode", "good", "good, wrongpong, leak, serial, ignorecancel, crashearly, spinearly, wrongphase, nobackoff, mute, answerall")

// stray is what -mode answerall sends for what it cannot use: a decision
// for request 0, which no event ever carries, byte for byte as the SDK
// that does this writes it.
func stray() protocol.Message { return strayDecision{} }

type strayDecision struct{}

func (strayDecision) MsgType() protocol.MsgType { return protocol.TypeDecision }
func (strayDecision) AppendJSON(dst []byte) ([]byte, error) {
	return append(dst, `{"request_id":0,"decision":"allow"}`...), nil
}

// leaked keeps per-request state forever in -mode leak.
var (
	leakMu sync.Mutex
	leaked [][]byte
)

func main() {
	socket := flag.String("socket", "", "Unix socket to serve on")
	reverse := flag.String("reverse", "", "reverse: the proxy's Unix socket to dial")
	flag.Parse()
	if *reverse != "" {
		dialLoop(*reverse)
		return
	}
	_ = os.Remove(*socket)
	ln, err := net.Listen("unix", *socket)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		go serve(nc, true)
	}
}

// dialLoop registers with a reverse listener, again and again; -mode
// nobackoff does so with no delay at all after a refusal or a loss.
func dialLoop(addr string) {
	delay := 50 * time.Millisecond
	for {
		nc, err := net.Dial("unix", addr)
		if err == nil {
			req := protocol.RegistrationRequest{ProtocolVersion: 2, AgentID: "broken-1", Capabilities: caps()}
			_ = uds.WriteFrame(nc, &req)
			fr := uds.NewFrameReader(nc)
			_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			t, p, err := fr.Next()
			_ = nc.SetReadDeadline(time.Time{})
			var resp protocol.RegistrationResponse
			if err == nil && t == protocol.TypeRegistrationResponse && protocol.DecodeRegistrationResponse(p, &resp) == nil && resp.Accepted {
				delay = 50 * time.Millisecond
				loop(nc, fr)
			}
			_ = nc.Close()
		}
		if *mode != "nobackoff" {
			time.Sleep(delay)
			delay = min(2*delay, time.Second)
		}
	}
}

func caps() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true, SupportsCancellation: true}
}

// serve runs one proxy connection: handshake, then events.
func serve(nc net.Conn, handshake bool) {
	defer func() { _ = nc.Close() }()
	fr := uds.NewFrameReader(nc)
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	t, p, err := fr.Next()
	_ = nc.SetReadDeadline(time.Time{})
	if err != nil {
		switch *mode {
		case "crashearly":
			fmt.Fprintln(os.Stderr, "connection closed before the handshake:", err)
			os.Exit(3)
		case "spinearly":
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				go func() {
					for { // a read loop that does not notice the end
					}
				}()
			}
		}
		return
	}
	if t != protocol.TypeHandshakeRequest {
		return
	}
	var req protocol.HandshakeRequest
	if protocol.DecodeHandshakeRequest(p, &req) != nil {
		return
	}
	resp := protocol.HandshakeResponse{ProtocolVersion: 2, AgentName: "broken-" + *mode, Accepted: true, Capabilities: caps()}
	if req.ProtocolVersion != 2 {
		resp.Accepted, resp.Error = false, fmt.Sprintf("unsupported protocol version: proxy speaks %d, agent speaks 2", req.ProtocolVersion)
		resp.Capabilities = protocol.Capabilities{}
		_ = uds.WriteFrame(nc, &resp)
		return
	}
	if err := uds.WriteFrame(nc, &resp); err != nil {
		return
	}
	loop(nc, fr)
}

// conn serializes the writes of one connection.
type conn struct {
	mu sync.Mutex
	nc net.Conn
}

func (c *conn) send(m protocol.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_ = uds.WriteFrame(c.nc, m)
}

func loop(nc net.Conn, fr *uds.FrameReader) {
	c := &conn{nc: nc}
	var mu sync.Mutex
	cancels := map[uint64]context.CancelFunc{}
	for {
		t, p, err := fr.Next()
		if err != nil {
			return
		}
		switch t {
		case protocol.TypePing:
			var pg protocol.Ping
			if pg.Decode(p) != nil {
				continue
			}
			if *mode == "wrongpong" {
				pg.Sequence++
			}
			c.send((*protocol.Pong)(&pg))
		case protocol.TypeCancelRequest:
			var m protocol.CancelRequest
			if m.Decode(p) == nil && *mode != "ignorecancel" {
				mu.Lock()
				if f := cancels[m.RequestID]; f != nil {
					f()
				}
				mu.Unlock()
			}
		case protocol.TypeCancelAll:
			if *mode != "ignorecancel" {
				mu.Lock()
				for _, f := range cancels {
					f()
				}
				mu.Unlock()
			}
		case protocol.TypeRequestHeaders, protocol.TypeRequestBodyChunk, protocol.TypeResponseHeaders, protocol.TypeResponseBodyChunk:
			id, ok := protocol.PeekRequestID(p)
			if !ok {
				if *mode == "answerall" {
					c.send(stray())
					continue
				}
				return
			}
			ev := append([]byte(nil), p...)
			ctx, cancel := context.WithCancel(context.Background())
			mu.Lock()
			cancels[id] = cancel
			mu.Unlock()
			work := func() {
				defer func() {
					mu.Lock()
					delete(cancels, id)
					mu.Unlock()
					cancel()
				}()
				if r := handle(ctx, t, id, ev); r != nil && (ctx.Err() == nil || *mode == "ignorecancel") {
					c.send(r)
				}
			}
			if *mode == "serial" {
				work() // one at a time, in the read loop
			} else {
				go work()
			}
		default: // unknown or misdirected: skipped, unless answerall
			if *mode == "answerall" {
				c.send(stray())
			}
		}
	}
}

// handle answers one event (allow, needs_more until the last chunk).
func handle(ctx context.Context, t protocol.MsgType, id uint64, p []byte) protocol.Message {
	switch *mode {
	case "serial":
		time.Sleep(20 * time.Millisecond) // blocking work, e.g. a lookup
	case "ignorecancel":
		select { // slow work that does not watch ctx
		case <-time.After(600 * time.Millisecond):
		case <-make(chan struct{}):
		}
	case "leak":
		leakMu.Lock()
		b := make([]byte, 16<<10)
		for i := range b {
			b[i] = byte(i)
		}
		leaked = append(leaked, b)
		leakMu.Unlock()
	default:
		_ = ctx
	}
	if *mode == "mute" {
		return nil // never answers an event (still answers Pings)
	}
	d := &protocol.Decision{RequestID: id, Kind: protocol.DecisionAllow}
	switch t {
	case protocol.TypeRequestHeaders:
		var m protocol.RequestHeaders
		if m.Decode(p) != nil {
			if *mode == "answerall" {
				return stray()
			}
			return &protocol.Decision{RequestID: id, Kind: protocol.DecisionUnset}
		}
		if *mode == "wrongphase" {
			return &protocol.BodyMutation{RequestID: id, Phase: protocol.PhaseRequest}
		}
	case protocol.TypeRequestBodyChunk, protocol.TypeResponseBodyChunk:
		var m protocol.BodyChunk
		if m.Decode(p) != nil {
			if *mode == "answerall" {
				return stray()
			}
			return &protocol.Decision{RequestID: id, Kind: protocol.DecisionUnset}
		}
		if !m.IsLast {
			d.NeedsMore = true
		}
	}
	return d
}
