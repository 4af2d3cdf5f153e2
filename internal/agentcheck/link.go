package agentcheck

import (
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// errNoRaw: the transport carries no frames the checker can forge (gRPC).
var errNoRaw = errors.New("agentcheck: raw frames need a framed transport")

// errAgentError: the agent answered an event with an agent_error (gRPC,
// or a protobuf payload) instead of a decision.
var errAgentError = errors.New("agent error")

// reply is one message received from the agent, decoded.
type reply struct {
	Type protocol.MsgType
	ID   uint64
	Dec  *protocol.Decision     // Type == TypeDecision and it decoded
	Mut  *protocol.BodyMutation // Type == TypeBodyMutation and it decoded
	Ping *protocol.Ping         // Type == TypePong or TypePing
	// AgentError is the text of an agent_error (gRPC, or a protobuf
	// payload).
	AgentError string
	// Err is a decode or validation error of the payload.
	Err error
	At  time.Time
	// The message as received, for Ev: a frame's payload (copied), or
	// the gRPC message.
	payload []byte
	pbm     *pb.AgentMessage
	proto   bool // payload is protobuf
}

// Ev is the message as evidence (type and payload). It is formatted only
// when a result shows it, not for every reply read.
func (r *reply) Ev() string {
	if r.pbm != nil {
		return "gRPC " + shortText(r.pbm)
	}
	if r.proto {
		return protobufEvidence(r.Type, r.payload)
	}
	return evidence(r.Type, r.payload)
}

// link is one connection to the agent after setup (handshake,
// registration or GetCapabilities).
type link interface {
	Caps() protocol.Capabilities
	// Send writes msgs with one write (framed) or in order (gRPC) and
	// returns them as evidence.
	Send(msgs ...protocol.Message) ([]string, error)
	// SendRaw writes b as it is (framed transports only).
	SendRaw(b []byte) error
	// Recv returns the next message of the agent, waiting at most d.
	Recv(d time.Duration) (*reply, error)
	Close()
	// Raw reports whether SendRaw works.
	Raw() bool
}

// ids are request ids: above 2^32 so that an agent that keeps them in 32
// bits is caught, far below 2^53 so that agents whose JSON numbers are
// doubles echo them exactly (docs/protocol.md §3.2).
var ids atomic.Uint64

// firstID is where ids start: every id the checker issues is above it.
const firstID = 1 << 32

func init() { ids.Store(firstID) }

func nextID() uint64 { return ids.Add(1) }

// maxStrayEvidence bounds the stray answers kept as evidence per check.
const maxStrayEvidence = 3

// strays collects the agent's answers (Decision, BodyMutation, an agent
// error) for request ids the checker never sent it in an event: 0, ids it
// never issued, and the ids it forged for frames that are not events (a
// misdirected Decision, a CancelRequest for an unknown request). An agent
// answers only the events it gets (docs/protocol.md §7.1); one that
// answers frames it should skip would make the proxy count late replies
// at best, and act on a decision nobody asked for at worst. The links'
// readers divert such answers here, away from the checks' inboxes, and
// each check fails with those that arrived while it ran (see judge).
type strays struct {
	mu     sync.Mutex
	forged map[uint64]bool
	got    []*reply // the first maxStrayEvidence since the last judge
	n      int      // since the last judge
}

func newStrays() *strays { return &strays{forged: map[uint64]bool{}} }

// forge issues an id for a frame that is not an event: an answer for it
// is a stray.
func (s *strays) forge() uint64 {
	id := nextID()
	s.mu.Lock()
	s.forged[id] = true
	s.mu.Unlock()
	return id
}

// divert keeps r if it answers a request that was never sent, and
// reports whether it did.
func (s *strays) divert(r *reply) bool {
	if r.Type != protocol.TypeDecision && r.Type != protocol.TypeBodyMutation {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.ID > firstID && r.ID <= ids.Load() && !s.forged[r.ID] {
		return false
	}
	if len(s.got) < maxStrayEvidence {
		s.got = append(s.got, r)
	}
	s.n++
	return true
}

// pending reports whether strays arrived since the last judge.
func (s *strays) pending() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n > 0
}

// judge fails r with the strays that arrived since the last call, the
// frames as evidence.
func (s *strays) judge(r *Result) {
	s.mu.Lock()
	got, n := s.got, s.n
	s.got, s.n = nil, 0
	s.mu.Unlock()
	if n == 0 {
		return
	}
	var ids []string
	for _, x := range got {
		r.Received = append(r.Received, x.Ev())
		if id := fmt.Sprint(x.ID); !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	what := "1 answer"
	if n > 1 {
		what = fmt.Sprintf("%d answers", n)
	}
	more := ""
	if n > len(got) {
		more = ", …"
	}
	worse(r, Fail, "the agent sent %s for requests it was never sent (request_id %s%s): an agent answers only the events it gets, each with its request_id, and skips the frames it cannot use; 0 is never a request's id (§7.1, §2.6, §9.2)",
		what, strings.Join(ids, ", "), more)
}

// maxEvidence bounds one payload shown as evidence.
const maxEvidence = 400

func evidence(t protocol.MsgType, payload []byte) string {
	p := payload
	cut := ""
	if len(p) > maxEvidence {
		p, cut = p[:maxEvidence], fmt.Sprintf("… (%d bytes)", len(payload))
	}
	return fmt.Sprintf("0x%02x %s %s%s", uint8(t), t, p, cut)
}

func rawEvidence(b []byte) string {
	if len(b) > 64 {
		return hex.EncodeToString(b[:64]) + fmt.Sprintf("… (%d bytes)", len(b))
	}
	return hex.EncodeToString(b)
}

// decodeFrame turns a frame of the agent into a reply; payload is copied.
func decodeFrame(t protocol.MsgType, payload []byte) *reply {
	p := append([]byte(nil), payload...)
	r := &reply{Type: t, At: time.Now(), payload: p}
	switch t {
	case protocol.TypeDecision:
		d := new(protocol.Decision)
		if err := d.Decode(p); err != nil {
			r.Err = err
		} else if err := d.Normalize(); err != nil {
			r.Err = err
		}
		r.ID, r.Dec = d.RequestID, d
		if r.Err != nil {
			r.ID, _ = protocol.PeekRequestID(p)
		}
	case protocol.TypeBodyMutation:
		m := new(protocol.BodyMutation)
		if err := m.Decode(p); err != nil {
			r.Err = err
			r.ID, _ = protocol.PeekRequestID(p)
		} else {
			r.ID, r.Mut = m.RequestID, m
		}
	case protocol.TypePong, protocol.TypePing:
		m := new(protocol.Ping)
		if err := m.Decode(p); err != nil {
			r.Err = err
		} else {
			r.Ping = m
		}
	default:
		r.ID, _ = protocol.PeekRequestID(p)
	}
	return r
}

// protobufEvidence shows a protobuf payload as hex.
func protobufEvidence(t protocol.MsgType, payload []byte) string {
	return fmt.Sprintf("0x%02x %s protobuf %s", uint8(t), t, rawEvidence(payload))
}

// decodeProtobufFrame is decodeFrame for a protobuf payload: an
// AgentMessage whose payload field must be the frame type's (an
// agent_error in a Decision frame is the agent's error for that request).
func decodeProtobufFrame(t protocol.MsgType, payload []byte) *reply {
	p := append([]byte(nil), payload...)
	r := &reply{Type: t, At: time.Now(), payload: p, proto: true}
	var f pbwire.Frame
	f.ParseAs(t, p)
	r.ID = f.RequestID
	if f.Err != nil {
		if pbwire.PayloadOf(t) != pbwire.PayloadNone {
			r.Err = f.Err
		}
		return r
	}
	switch f.Payload {
	case pbwire.PayloadDecision:
		d := new(protocol.Decision)
		if err := f.DecodeDecision(d); err != nil {
			r.Err = err
		} else if err := d.Normalize(); err != nil {
			r.Err = err
		}
		r.Dec = d
	case pbwire.PayloadAgentError:
		msg, err := f.AgentError()
		if err == nil {
			r.AgentError = msg
			err = fmt.Errorf("%w: %q", errAgentError, msg)
		}
		r.Err = err
	case pbwire.PayloadBodyMutation:
		m := new(protocol.BodyMutation)
		if err := f.DecodeBodyMutation(m); err != nil {
			r.Err = err
		} else {
			r.Mut = m
		}
	case pbwire.PayloadPing, pbwire.PayloadPong:
		m := new(protocol.Ping)
		if err := f.DecodePing(m); err != nil {
			r.Err = err
		} else {
			r.Ping = m
		}
	}
	return r
}

// framedLink is a UDS or reverse connection after its setup.
type framedLink struct {
	inbox
	nc   net.Conn
	caps protocol.Capabilities
	enc  uds.Encoding
	once sync.Once
	wmu  sync.Mutex
	wto  time.Duration
}

// newFramedLink starts reading frames from fr (which reads nc), whose
// payloads are in encoding enc.
func newFramedLink(nc net.Conn, fr *uds.FrameReader, caps protocol.Capabilities, wto time.Duration, enc uds.Encoding, s *strays) *framedLink {
	l := &framedLink{inbox: newInbox(s), nc: nc, caps: caps, wto: wto, enc: enc}
	go l.read(fr)
	return l
}

func (l *framedLink) read(fr *uds.FrameReader) {
	defer close(l.done)
	for {
		t, p, err := fr.Next()
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				err = ErrClosed
			}
			l.err = err
			return
		}
		r := decodeFrame
		if l.enc == uds.Protobuf {
			r = decodeProtobufFrame
		}
		if !l.deliver(r(t, p)) {
			// Nobody reads: a flood from the agent must not block or grow
			// the checker.
			l.err = fmt.Errorf("agentcheck: more than %d unread frames from the agent", cap(l.ch))
			_ = l.nc.Close()
			return
		}
	}
}

func (l *framedLink) Caps() protocol.Capabilities { return l.caps }
func (l *framedLink) Raw() bool                   { return true }

func (l *framedLink) Send(msgs ...protocol.Message) ([]string, error) {
	var b []byte
	ev := make([]string, 0, len(msgs))
	for _, m := range msgs {
		start := len(b)
		var err error
		b, err = uds.AppendFrameAs(b, m, l.enc)
		if err != nil {
			return ev, err
		}
		if l.enc == uds.Protobuf {
			ev = append(ev, protobufEvidence(m.MsgType(), b[start+uds.HeaderSize:]))
			continue
		}
		ev = append(ev, evidence(m.MsgType(), b[start+uds.HeaderSize:]))
	}
	return ev, l.SendRaw(b)
}

func (l *framedLink) SendRaw(b []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_ = l.nc.SetWriteDeadline(time.Now().Add(l.wto))
	_, err := l.nc.Write(b)
	return err
}

func (l *framedLink) Close() { l.once.Do(func() { _ = l.nc.Close() }) }

// inbox holds the replies a link's reader goroutine has decoded, for
// Recv; both transports share it.
type inbox struct {
	ch     chan *reply
	done   chan struct{} // closed when the reader ends
	err    error         // why it ended; set before done closes
	strays *strays       // where answers to no request go (nil: to ch)
}

func newInbox(s *strays) inbox {
	return inbox{ch: make(chan *reply, 8192), done: make(chan struct{}), strays: s}
}

// deliver hands r to Recv, or to strays when it answers no request; false
// when nobody reads and the inbox is full.
func (b *inbox) deliver(r *reply) bool {
	if b.strays != nil && b.strays.divert(r) {
		return true
	}
	select {
	case b.ch <- r:
		return true
	default:
		return false
	}
}

// Recv returns the next reply, waiting at most d; replies read before the
// connection ended still come first.
func (b *inbox) Recv(d time.Duration) (*reply, error) {
	select {
	case r := <-b.ch:
		return r, nil
	default:
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case r := <-b.ch:
		return r, nil
	case <-b.done:
		select {
		case r := <-b.ch:
			return r, nil
		default:
		}
		return nil, b.err
	case <-t.C:
		return nil, fmt.Errorf("%w (%v)", ErrTimeout, d)
	}
}

// alive reports whether the reader still runs (the agent has not closed
// the connection).
func (b *inbox) alive() bool {
	select {
	case <-b.done:
		return false
	default:
		return true
	}
}

// readFirstFrame reads one frame from fr within d (handshake and
// registration answers).
func readFirstFrame(nc net.Conn, fr *uds.FrameReader, d time.Duration) (protocol.MsgType, []byte, error) {
	_ = nc.SetReadDeadline(time.Now().Add(d))
	defer func() { _ = nc.SetReadDeadline(time.Time{}) }()
	t, p, err := fr.Next()
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return 0, nil, fmt.Errorf("%w (%v)", ErrTimeout, d)
		}
		if errors.Is(err, io.EOF) {
			return 0, nil, ErrClosed
		}
		return 0, nil, err
	}
	return t, append([]byte(nil), p...), nil
}

// recvFor collects the replies for the ids in want until each has one
// final answer or d passes; other replies go to extra.
func recvFor(l link, want map[uint64]bool, d time.Duration) (got map[uint64]*reply, extra []*reply, err error) {
	got = map[uint64]*reply{}
	deadline := time.Now().Add(d)
	for len(got) < len(want) {
		left := time.Until(deadline)
		if left <= 0 {
			return got, extra, fmt.Errorf("%w (%v)", ErrTimeout, d)
		}
		r, err := l.Recv(left)
		if err != nil {
			return got, extra, err
		}
		if want[r.ID] && (r.Type == protocol.TypeDecision || r.Type == protocol.TypeBodyMutation) {
			if got[r.ID] != nil {
				extra = append(extra, r) // a second answer
				continue
			}
			got[r.ID] = r
			continue
		}
		extra = append(extra, r)
	}
	return got, extra, nil
}

// answer waits for the reply to request id, skipping others (returned).
func answer(l link, id uint64, d time.Duration) (*reply, []*reply, error) {
	got, extra, err := recvFor(l, map[uint64]bool{id: true}, d)
	return got[id], extra, err
}
