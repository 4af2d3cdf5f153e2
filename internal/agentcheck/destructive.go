package agentcheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
	"google.golang.org/protobuf/encoding/protowire"
)

// agentAlive checks that the agent survived what a check did to it: its
// process (when known) is alive and a new connection serves a Ping.
func (e *env) agentAlive(r *Result) bool {
	failed := func(format string, args ...any) bool {
		if e.cfg.PID > 0 && e.exited() {
			worse(r, Fail, "the agent's process %d is gone", e.cfg.PID)
		} else {
			worse(r, Fail, format, args...)
		}
		return false
	}
	if e.cfg.PID > 0 && !procAlive(e.cfg.PID) {
		return failed("")
	}
	l, err := e.open()
	if err != nil {
		return failed("the agent no longer accepts a new connection: %v", err)
	}
	defer e.release(l, false)
	if err := stillServes(l, e.cfg.Timeout); err != nil {
		return failed("a new connection does not answer a Ping: %v", err)
	}
	return true
}

// exited reports whether the agent's process ends within a second: a
// connection refused or reset may come from a process on its way out.
func (e *env) exited() bool {
	deadline := time.Now().Add(time.Second)
	for procAlive(e.cfg.PID) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// rawCase sends b on a fresh connection and reports how the agent took it:
// an answer for id, a close, or silence within the timeout.
func rawCase(e *env, r *Result, b []byte, id uint64) (answered *reply, closed bool, ok bool) {
	l := e.openFor(r)
	if l == nil {
		return nil, false, false
	}
	defer e.release(l, true)
	r.Sent = append(r.Sent, rawEvidence(b))
	if err := l.SendRaw(b); err != nil {
		return nil, true, true
	}
	deadline := time.Now().Add(e.cfg.Timeout)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return nil, false, true
		}
		x, err := l.Recv(left)
		switch {
		case errors.Is(err, ErrTimeout):
			return nil, false, true
		case err != nil:
			return nil, true, true
		case id != 0 && x.ID == id:
			r.Received = append(r.Received, x.Ev())
			return x, false, true
		}
	}
}

func checkMalformedJSON(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	c := l.Caps()
	e.release(l, false)
	ev := firstEvent(c, 1, "/")
	if ev == nil {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	id := nextID()
	b, _ := uds.AppendRawFrame(nil, ev.MsgType(), []byte(fmt.Sprintf(`{"request_id":%d,"method":"GET","uri":`, id)))
	if e.protobuf() {
		// request_id, then the event's field with a length past the end.
		p := protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), id)
		p = append(protowire.AppendTag(p, pbwire.PayloadOf(ev.MsgType()).Field(), protowire.BytesType), 0x7f, 0x01)
		b, _ = uds.AppendRawFrame(nil, ev.MsgType(), p)
	}
	x, closed, ok := rawCase(e, r, b, id)
	if !ok {
		return
	}
	switch {
	case x != nil && x.Type == protocol.TypeDecision && (x.Err != nil || x.Dec.Kind != protocol.DecisionAllow):
		note(r, "answered with an agent error (a Decision the proxy refuses), as §4.13 suggests")
	case x != nil:
		worse(r, Warn, "answered an undecodable event with a valid %s: the agent acted on an event it could not read", x.Type)
	case closed:
		note(r, "closed the connection (the proxy fails that connection's requests at once)")
	case e.strays.pending():
		note(r, "no answer for request_id %d", id) // judged with what it answered instead
	default:
		worse(r, Warn, "neither answered nor closed within %v: the request waits for its timeout (§4.13: an agent SHOULD NOT leave an event unanswered)", e.cfg.Timeout)
	}
	e.agentAlive(r)
}

func checkMalformedNoID(e *env, r *Result) {
	b, _ := uds.AppendRawFrame(nil, protocol.TypeRequestHeaders, []byte("this is not JSON"))
	_, closed, ok := rawCase(e, r, b, 0)
	if !ok {
		return
	}
	switch {
	case closed:
		note(r, "closed the connection, as §9.2 says")
	case e.strays.pending():
		note(r, "kept the connection") // judged with what it answered (see strays)
	default:
		note(r, "skipped it and kept the connection")
	}
	e.agentAlive(r)
}

func checkZeroLength(e *env, r *Result) {
	// The type byte follows: a reader needs it to see the whole header.
	_, closed, ok := rawCase(e, r, []byte{0, 0, 0, 0, byte(protocol.TypeRequestHeaders)}, 0)
	if !ok {
		return
	}
	if closed {
		note(r, "closed the connection")
	} else {
		worse(r, Warn, "kept the connection for %v after a zero-length frame; §2.2 says the connection is closed", e.cfg.Timeout)
	}
	e.agentAlive(r)
}

func checkOversized(e *env, r *Result) {
	b := make([]byte, uds.HeaderSize, uds.HeaderSize+16)
	binary.BigEndian.PutUint32(b, protocol.MaxFrameSize+1)
	b[4] = byte(protocol.TypeRequestBodyChunk)
	b = append(b, `{"request_id":1,`...)
	_, closed, ok := rawCase(e, r, b, 0)
	if !ok {
		return
	}
	if closed {
		note(r, "closed the connection without reading the frame")
	} else {
		worse(r, Warn, "kept the connection for %v after a frame announcing %d bytes; §2.2 says it is closed without reading the frame", e.cfg.Timeout, protocol.MaxFrameSize+1)
	}
	e.agentAlive(r)
}

// spinCheck fails r when the agent's process uses the CPU while idle.
func (e *env) spinCheck(r *Result) {
	if e.cfg.PID <= 0 {
		note(r, "no -pid: CPU not watched")
		return
	}
	share, err := cpuShare(e.ctx, e.cfg.PID)
	if err != nil {
		worse(r, Warn, "CPU of process %d not readable: %v", e.cfg.PID, err)
		return
	}
	if share > spinLimit {
		worse(r, Fail, "the idle agent wants %.0f%% of a core (running or waiting to run) after the early closes: it is spinning", share*100)
		return
	}
	note(r, "idle agent afterwards wants %.1f%% of a core", share*100)
}

func checkEarlyClose(e *env, r *Result) {
	switch e.cfg.Transport {
	case TransportUDS:
		hs, _ := uds.AppendFrame(nil, handshakeRequest(protocol.Version))
		cases := []struct {
			what string
			b    []byte
		}{
			{"connect and close", nil},
			{"close after 3 bytes of the HandshakeRequest header", hs[:3]},
			{"close mid-frame (header and half the payload)", hs[:len(hs)/2]},
			{"close right after the HandshakeRequest", hs},
		}
		for _, c := range cases {
			nc, err := e.dialRaw()
			if err != nil {
				if e.cfg.PID > 0 && e.exited() {
					worse(r, Fail, "the agent's process %d is gone after %s", e.cfg.PID, r.Sent)
				} else {
					worse(r, Fail, "after %s the agent no longer accepts connections: %v", r.Sent, err)
				}
				return
			}
			if c.b != nil {
				_ = nc.SetWriteDeadline(time.Now().Add(e.cfg.Timeout))
				_, _ = nc.Write(c.b)
			}
			_ = nc.Close()
			r.Sent = append(r.Sent, c.what)
		}
	case TransportGRPC:
		cc, _, err := dialGRPC(e.cfg.Address)
		if err == nil {
			_ = cc.Close()
		}
		r.Sent = append(r.Sent, "connect and close")
	case TransportReverse:
		if e.cur != nil {
			e.cur.Close() // so that the agent connects again
			e.cur = nil
		}
		// The registration is read, then the connection closed without
		// the RegistrationResponse; then one closed at once.
		reg, err := e.readRegistration(e.cfg.ReconnectWait)
		if err != nil {
			worse(r, Fail, "no registration: %v", err)
			return
		}
		_ = reg.nc.Close()
		r.Sent = append(r.Sent, "close before the RegistrationResponse")
		nc, _, err := e.acceptRaw(e.cfg.ReconnectWait)
		if err != nil {
			worse(r, Fail, "the agent did not connect again after a connection closed before the registration reply: %v", err)
			return
		}
		_ = nc.Close()
		r.Sent = append(r.Sent, "close at once, before reading the registration")
	}
	// An event whose connection closes before the reply.
	if l, err := e.open(); err == nil {
		if ev := firstEvent(l.Caps(), nextID(), "/agentcheck/early"); ev != nil {
			_, _ = l.Send(ev)
			r.Sent = append(r.Sent, "close right after an event, before its reply")
		}
		e.release(l, true)
	}
	if !e.agentAlive(r) {
		return
	}
	e.spinCheck(r)
}

func checkReconnect(e *env, r *Result) {
	if e.cur != nil {
		e.cur.Close() // the agent must come back on its own
		e.cur = nil
	}
	closed := time.Now()
	var gaps []time.Duration
	for i := 0; i < 3; i++ {
		reg, err := e.readRegistration(e.cfg.ReconnectWait)
		if err != nil {
			worse(r, Fail, "the agent did not register again within %v after %d refusals: %v", e.cfg.ReconnectWait, i, err)
			return
		}
		gaps = append(gaps, reg.at.Sub(closed))
		if i == 0 {
			r.Received = append(r.Received, reg.ev)
		}
		// A refusal retrying can fix (§6.2 check 8).
		_ = answerRegistration(reg, false, "proxy shutting down", uds.JSON)
		_ = reg.nc.Close()
		closed = time.Now()
		if i == 0 {
			r.Sent = append(r.Sent, `0x04 RegistrationResponse {"accepted":false,"error":"proxy shutting down"} (×3)`)
		}
	}
	if _, err := e.open(); err != nil {
		worse(r, Fail, "after three refusals the agent did not register again: %v", err)
		return
	}
	gaps = append(gaps, time.Since(closed))
	round := make([]string, len(gaps))
	for i, g := range gaps {
		round[i] = g.Round(time.Millisecond).String()
	}
	minGap := gaps[1]
	for _, g := range gaps[1:] {
		minGap = min(minGap, g)
	}
	// The first gap follows a lost connection; the others follow refusals.
	if minGap < 10*time.Millisecond {
		worse(r, Fail, "reconnects after %v: no backoff after a refused registration (§7.10: a delay doubling, with jitter)", round)
		return
	}
	note(r, "registered again after %v (close, then three refusals)", round)
	if e.cfg.PID > 0 && !procAlive(e.cfg.PID) {
		worse(r, Fail, "the agent's process %d is gone", e.cfg.PID)
	}
}
