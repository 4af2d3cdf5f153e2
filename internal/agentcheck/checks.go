package agentcheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// check is one row of the table.
type check struct {
	id, title, rule string
	// transports it applies to; others report SKIP with skipWhy.
	on      []string
	skipWhy string
	run     func(e *env, r *Result)
}

var checks = []check{
	{"handshake", "handshake and capabilities", "§5 Handshake, §4.2 HandshakeResponse", []string{TransportUDS, TransportGRPC}, "a reverse agent registers instead (see registration)", checkHandshake},
	{"registration", "registration and capabilities", "§6 Reverse registration, §4.3 RegistrationRequest", []string{TransportReverse}, "only reverse agents register", checkHandshake},
	{"version-refusal", "refuses protocol version 3", "§11 Versioning, §5 Handshake (agent side)", []string{TransportUDS, TransportGRPC}, "a reverse agent states its version; the proxy judges it (§6.2)", checkVersion},
	{"ping", "Ping answered by a Pong echoing sequence and timestamp", "§4.12 Ping and Pong, §7.9 Liveness", nil, "", checkPing},
	{"unknown-frames", "unknown and misdirected frames ignored", "§2.6 Unknown and misdirected types, §11 Versioning", nil, "", checkUnknown},
	{"correlation", "request_id correlation with many requests in flight", "§7.1 Request ids, §7.2 One event outstanding per request, §3.2 Numbers", nil, "", checkCorrelation},
	{"concurrency", "concurrency achieved vs. max_concurrent_requests", "§7.6 In-flight limit and queue, §12 (requests handled concurrently)", nil, "", checkConcurrency},
	{"phases", "each declared phase answered with the right message", "§7.2, §7.3 Which events, §7.4 Body chunks, §7.5 needs_more, §8.5 Body mutations", nil, "", checkPhases},
	{"cancel", "CancelRequest honoured", "§4.10 CancelRequest, §7.8 Cancellation", nil, "", checkCancel},
	{"cancel-all", "CancelAll honoured", "§4.11 CancelAll, §7.8 Cancellation", nil, "", checkCancelAll},
	{"malformed-json", "undecodable event with a readable request_id", "§9.2 Agent side, §4.13 Agent errors", []string{TransportUDS, TransportReverse}, "gRPC carries no raw frames", checkMalformedJSON},
	{"malformed-noid", "payload that is not JSON", "§9.2 Agent side, §3.1 The payload", []string{TransportUDS, TransportReverse}, "gRPC carries no raw frames", checkMalformedNoID},
	{"zero-length-frame", "zero-length frame", "§2.2 Limits, checked before allocation", []string{TransportUDS, TransportReverse}, "gRPC carries no raw frames", checkZeroLength},
	{"oversized-frame", "frame announced over 16 MiB", "§2.2 Limits, checked before allocation", []string{TransportUDS, TransportReverse}, "gRPC carries no raw frames", checkOversized},
	{"early-close", "connections closed at awkward moments", "§5 Handshake (agent side), §9.2 Agent side, §2.3 Frame timeout", nil, "", checkEarlyClose},
	{"reconnect", "reconnects with backoff and registers again", "§7.10 Reconnection, §6.5, §9.2 (reverse registration refused)", []string{TransportReverse}, "only reverse agents dial the proxy", checkReconnect},
}

// CheckIDs lists the ids of the checks, in the order they run.
func CheckIDs() []string {
	out := make([]string, len(checks))
	for i, c := range checks {
		out[i] = c.id
	}
	return out
}

func (e *env) runAll() {
	if !e.cfg.SkipChecks {
		for _, c := range checks {
			if len(e.cfg.Only) > 0 && !slices.Contains(e.cfg.Only, c.id) {
				continue
			}
			if e.ctx.Err() != nil {
				return
			}
			r := Result{ID: c.id, Title: c.title, Rule: "docs/protocol.md " + c.rule, Status: Pass}
			start := time.Now()
			if c.on != nil && !slices.Contains(c.on, e.cfg.Transport) {
				r.Status, r.Detail = Skip, c.skipWhy
			} else {
				c.run(e, &r)
				e.strays.judge(&r)
			}
			r.Elapsed = time.Since(start)
			e.report.Results = append(e.report.Results, r)
		}
	}
	if e.cfg.Soak > 0 || e.cfg.Requests > 0 {
		e.runSoak()
	}
	if e.cfg.Expectations != nil {
		e.runExpectations(e.cfg.Expectations)
	}
	e.report.Agent = e.agentName
}

// worse sets r's status to s if s is worse, and adds the detail.
func worse(r *Result, s Status, format string, args ...any) {
	rank := map[Status]int{Pass: 0, Skip: 1, Warn: 2, Fail: 3}
	if rank[s] > rank[r.Status] {
		r.Status = s
	}
	note(r, format, args...)
}

func note(r *Result, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if r.Detail == "" {
		r.Detail = msg
	} else {
		r.Detail += "; " + msg
	}
}

// openFor opens a link for a check, failing the check when it cannot.
func (e *env) openFor(r *Result) link {
	l, err := e.open()
	if err != nil {
		worse(r, Fail, "cannot set up a connection: %v", err)
		return nil
	}
	return l
}

// firstEvent is the first event the agent gets for a request, by the
// phases it declares (docs/protocol.md §7.3); nil when it handles none.
func firstEvent(c protocol.Capabilities, id uint64, uri string) protocol.Message {
	switch {
	case c.HandlesRequestHeaders:
		return reqHeaders(id, "GET", uri, false)
	case c.HandlesRequestBody:
		return reqChunk(id, 0, []byte("agent-check"), true)
	case c.HandlesResponseHeaders:
		return respHeaders(id)
	case c.HandlesResponseBody:
		return (*protocol.ResponseBodyChunk)(&protocol.BodyChunk{RequestID: id, Data: []byte("agent-check"), IsLast: true, TotalSize: -1, Progress: -1})
	}
	return nil
}

func reqHeaders(id uint64, method, uri string, body bool) *protocol.RequestHeaders {
	return &protocol.RequestHeaders{RequestID: id, Method: []byte(method), URI: []byte(uri), HasBody: body,
		Headers: protocol.Headers{
			{Name: []byte("host"), Value: []byte("example.com")},
			{Name: []byte("user-agent"), Value: []byte("curl/8.5.0")},
			{Name: []byte("accept"), Value: []byte("*/*")},
		},
		Metadata: protocol.Metadata{CorrelationID: []byte("agentcheck"), ClientIP: []byte("127.0.0.1"), ClientPort: 40000,
			Protocol: []byte("HTTP/1.1"), ServerName: []byte("example.com"), RouteID: []byte("default"), UpstreamID: []byte("app")}}
}

func reqChunk(id uint64, idx uint32, data []byte, last bool) *protocol.RequestBodyChunk {
	return (*protocol.RequestBodyChunk)(&protocol.BodyChunk{RequestID: id, ChunkIndex: idx, Data: data, IsLast: last, TotalSize: -1, Progress: -1})
}

func respChunk(id uint64, idx uint32, data []byte, last bool) *protocol.ResponseBodyChunk {
	return (*protocol.ResponseBodyChunk)(&protocol.BodyChunk{RequestID: id, ChunkIndex: idx, Data: data, IsLast: last, TotalSize: -1, Progress: -1})
}

func respHeaders(id uint64) *protocol.ResponseHeaders {
	return &protocol.ResponseHeaders{RequestID: id, StatusCode: 200, HasBody: true,
		Headers: protocol.Headers{{Name: []byte("content-type"), Value: []byte("text/plain; charset=utf-8")}}}
}

// ping sends a Ping and waits for its Pong, skipping other messages.
func ping(l link, d time.Duration) (sent *protocol.Ping, got *reply, ev []string, rtt time.Duration, err error) {
	p := &protocol.Ping{Sequence: rand.Uint64N(1 << 52), TimestampMs: time.Now().UnixMilli()}
	start := time.Now()
	ev, err = l.Send(p)
	if err != nil {
		return p, nil, ev, 0, err
	}
	deadline := start.Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return p, nil, ev, 0, fmt.Errorf("%w: no Pong within %v", ErrTimeout, d)
		}
		r, err := l.Recv(left)
		if err != nil {
			return p, nil, ev, 0, err
		}
		if r.Type == protocol.TypePong {
			return p, r, ev, time.Since(start), nil
		}
	}
}

// stillServes checks that l still answers a Ping.
func stillServes(l link, d time.Duration) error {
	_, _, _, _, err := ping(l, d)
	return err
}

func capsJSON(c protocol.Capabilities) string {
	b, _ := json.Marshal(c)
	return string(b)
}

// ---------------------------------------------------------------------------

func checkHandshake(e *env, r *Result) {
	l := e.openFor(r)
	r.Sent, r.Received = e.setupSent, e.setupRecv
	if l == nil {
		return
	}
	defer e.release(l, false)
	c := l.Caps()
	if e.cfg.Transport == TransportGRPC {
		r.Sent = []string{"gRPC GetCapabilities " + shortText(capsRequest(protocol.Version)), "gRPC HealthCheck {}"}
		r.Received = []string{"capabilities " + capsJSON(c) + "; HealthCheck SERVING"}
	}
	note(r, "capabilities %s", capsJSON(c))
	if !c.HandlesRequestHeaders && !c.HandlesRequestBody && !c.HandlesResponseHeaders && !c.HandlesResponseBody {
		worse(r, Warn, "the agent declares no phase: it will never get an event (§4.2 Capabilities)")
	}
	if c.SupportsInlineBody && !(c.HandlesRequestHeaders && c.HandlesRequestBody) {
		worse(r, Warn, "supports_inline_body without handles_request_headers and handles_request_body has no effect (§7.4.1)")
	}
	if c.SupportsStreaming && !c.HandlesRequestBody && !c.HandlesResponseBody {
		worse(r, Warn, "supports_streaming without a body phase has no effect (§4.2 Capabilities)")
	}
}

func checkVersion(e *env, r *Result) {
	if e.cfg.Transport == TransportGRPC {
		cc, cl, err := dialGRPC(e.cfg.Address)
		if err != nil {
			worse(r, Fail, "%v", err)
			return
		}
		defer func() { _ = cc.Close() }()
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.Timeout)
		defer cancel()
		req := capsRequest(3)
		r.Sent = []string{"gRPC GetCapabilities " + shortText(req)}
		resp, err := cl.GetCapabilities(ctx, req)
		switch {
		case err != nil:
			r.Received = []string{"gRPC error: " + err.Error()}
			note(r, "refused with a gRPC error")
		case resp.Accepted != nil && !*resp.Accepted || resp.GetError() != "":
			r.Received = []string{shortText(resp)}
			note(r, "refused: %q", resp.GetError())
		default:
			r.Received = []string{shortText(resp)}
			worse(r, Fail, "the agent accepted a CapabilityRequest of protocol version 3; it must refuse a version it does not speak")
		}
		return
	}
	nc, err := e.dialRaw()
	if err != nil {
		worse(r, Fail, "%v", err)
		return
	}
	defer func() { _ = nc.Close() }()
	req := handshakeRequest(3)
	b, _ := uds.AppendFrame(nil, req)
	r.Sent = []string{evidence(protocol.TypeHandshakeRequest, b[uds.HeaderSize:])}
	_ = nc.SetWriteDeadline(time.Now().Add(e.cfg.Timeout))
	if _, err := nc.Write(b); err != nil {
		note(r, "the agent closed before the HandshakeRequest was written: %v", err)
		return
	}
	t, p, err := readFirstFrame(nc, uds.NewFrameReader(nc), e.cfg.Timeout)
	switch {
	case errors.Is(err, ErrTimeout):
		worse(r, Fail, "no answer and no close within %v: the proxy would wait for its handshake timeout", e.cfg.Timeout)
		return
	case err != nil:
		worse(r, Warn, "the agent closed the connection without the refusal answer (%v); the proxy then only logs a lost connection", err)
		return
	}
	r.Received = []string{evidence(t, p)}
	var resp protocol.HandshakeResponse
	if t != protocol.TypeHandshakeResponse || protocol.DecodeHandshakeResponse(p, &resp) != nil {
		worse(r, Fail, "the answer is not a decodable HandshakeResponse")
		return
	}
	if resp.Accepted && resp.Error == "" {
		worse(r, Fail, "the agent accepted a HandshakeRequest of protocol version 3; it must refuse it, naming both versions")
		return
	}
	if !strings.Contains(resp.Error, "3") || !strings.Contains(resp.Error, "2") {
		worse(r, Warn, "the refusal should name both versions (§11): %q", resp.Error)
		return
	}
	note(r, "refused: %q", resp.Error)
}

func checkPing(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	defer e.release(l, false)
	sent, got, ev, rtt, err := ping(l, e.cfg.Timeout)
	r.Sent = ev
	if err != nil {
		worse(r, Fail, "%v", err)
		return
	}
	r.Received = []string{got.Ev()}
	switch {
	case got.Err != nil || got.Ping == nil:
		worse(r, Fail, "the Pong does not decode: %v", got.Err)
	case got.Ping.Sequence != sent.Sequence || got.Ping.TimestampMs != sent.TimestampMs:
		worse(r, Fail, "the Pong must echo the Ping's payload: sent sequence %d timestamp_ms %d, got %d and %d",
			sent.Sequence, sent.TimestampMs, got.Ping.Sequence, got.Ping.TimestampMs)
	default:
		e.pingRTT = rtt
		note(r, "round trip %v", rtt.Round(time.Microsecond))
	}
}

func checkUnknown(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	dirty := false
	defer func() { e.release(l, dirty) }()
	if !l.Raw() {
		// gRPC: an AgentMessage whose only field is unknown (a payload
		// from a newer proxy).
		gl := l.(*grpcLink)
		m := &pb.AgentMessage{}
		var unk []byte
		unk = protowire.AppendTag(unk, 99, protowire.BytesType)
		unk = protowire.AppendBytes(unk, []byte(`future`))
		m.ProtoReflect().SetUnknown(unk)
		r.Sent = []string{"gRPC AgentMessage with unknown field 99"}
		gl.smu.Lock()
		err := gl.stream.Send(m)
		gl.smu.Unlock()
		if err != nil {
			worse(r, Fail, "send: %v", err)
			return
		}
	} else {
		var b []byte
		frames := []struct {
			t protocol.MsgType
			p string
		}{
			{0x7e, `{"future":true}`},
			{protocol.TypeHandshakeResponse, `{"protocol_version":2,"accepted":true}`},
			{protocol.TypeDecision, fmt.Sprintf(`{"request_id":%d,"decision":"allow"}`, e.strays.forge())},
		}
		if e.protobuf() {
			// The same on protobuf payloads (a handshake is JSON anyway):
			// an AgentMessage with only an unknown field in a frame of an
			// unknown type, and a Decision sent the wrong way.
			unk := protowire.AppendTag(nil, 99, protowire.BytesType)
			unk = protowire.AppendBytes(unk, []byte(`future`))
			dec, _ := pbwire.AppendMessage(nil, &protocol.Decision{RequestID: e.strays.forge()})
			frames[0].p, frames[2].p = string(unk), string(dec)
		}
		for i, f := range frames {
			b, _ = uds.AppendRawFrame(b, f.t, []byte(f.p))
			if e.protobuf() && i != 1 {
				r.Sent = append(r.Sent, protobufEvidence(f.t, []byte(f.p)))
				continue
			}
			r.Sent = append(r.Sent, evidence(f.t, []byte(f.p)))
		}
		if err := l.SendRaw(b); err != nil {
			worse(r, Fail, "send: %v", err)
			dirty = true
			return
		}
	}
	sent, got, ev, _, err := ping(l, e.cfg.Timeout)
	r.Sent = append(r.Sent, ev...)
	if err != nil {
		dirty = true
		worse(r, Fail, "after frames it must skip, the agent no longer answers a Ping: %v", err)
		return
	}
	r.Received = []string{got.Ev()}
	// An answer to one of them may come after the Pong (an agent that
	// handles frames concurrently): give it the time of a late reply.
	e.settle()
	if got.Ping == nil || got.Ping.Sequence != sent.Sequence {
		worse(r, Warn, "the Pong does not echo the Ping (see the ping check)")
		return
	}
	if e.strays.pending() {
		note(r, "still answers a Ping")
		return // judged with the answers it sent (see strays)
	}
	note(r, "skipped them and still answers a Ping")
}

// settle waits as long as a late reply may take, for answers that are
// not awaited (see strays), bounded by the timeout.
func (e *env) settle() {
	t := time.NewTimer(min(e.cfg.Timeout, e.lateAfter()))
	defer t.Stop()
	select {
	case <-t.C:
	case <-e.ctx.Done():
	}
}

// burst sends the first event of n requests in one write and waits for
// all the answers.
func burst(e *env, l link, n int, tag string, after ...protocol.Message) (ids []uint64, got map[uint64]*reply, extra []*reply, ev []string, took time.Duration, err error) {
	msgs := make([]protocol.Message, n)
	want := map[uint64]bool{}
	for i := range msgs {
		id := nextID()
		ids = append(ids, id)
		want[id] = true
		msgs[i] = firstEvent(l.Caps(), id, fmt.Sprintf("/agentcheck/%s/%d", tag, i))
	}
	start := time.Now()
	ev, err = l.Send(append(msgs, after...)...)
	if err != nil {
		return ids, nil, nil, ev, 0, err
	}
	got, extra, err = recvFor(l, want, e.cfg.Timeout+time.Duration(n)*time.Millisecond)
	return ids, got, extra, ev, time.Since(start), err
}

// limitOf is the agent's declared per-connection limit capped at n.
func limitOf(c protocol.Capabilities, n int) int {
	if c.MaxConcurrentRequests > 0 && int(c.MaxConcurrentRequests) < n {
		return int(c.MaxConcurrentRequests)
	}
	return n
}

func checkCorrelation(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	dirty := false
	defer func() { e.release(l, dirty) }()
	if firstEvent(l.Caps(), 1, "/") == nil {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	n := limitOf(l.Caps(), DefaultCorrelationRequests)
	ids, got, extra, ev, took, err := burst(e, l, n, "corr")
	r.Sent = append(ev[:min(2, len(ev))], fmt.Sprintf("… %d events in one write, request_id %d … %d", n, ids[0], ids[len(ids)-1]))
	for _, id := range ids[:min(2, len(ids))] {
		if g := got[id]; g != nil {
			r.Received = append(r.Received, g.Ev())
		}
	}
	if err != nil {
		dirty = true
		worse(r, Fail, "%d of %d requests answered: %v", len(got), n, err)
	}
	for _, x := range extra {
		if x.Type == protocol.TypeDecision || x.Type == protocol.TypeBodyMutation {
			dirty = true
			r.Received = append(r.Received, x.Ev())
			worse(r, Fail, "a reply for request_id %d, which has no event outstanding (an id not echoed exactly, or a second reply) (§7.1, §7.2)", x.ID)
			break
		}
	}
	bad := 0
	for _, id := range ids {
		if g := got[id]; g != nil && g.Err != nil {
			if bad == 0 {
				r.Received = append(r.Received, g.Ev())
				worse(r, Fail, "invalid reply for request %d: %v", id, g.Err)
			}
			bad++
		}
	}
	if bad > 1 {
		note(r, "%d invalid replies in all", bad)
	}
	if r.Status == Pass {
		note(r, "%d requests in flight, each answered once with its request_id, in %v", n, took.Round(time.Microsecond))
	}
}

func checkConcurrency(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	dirty := false
	defer func() { e.release(l, dirty) }()
	c := l.Caps()
	if firstEvent(c, 1, "/") == nil {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	announced := "no limit"
	if c.MaxConcurrentRequests > 0 {
		announced = fmt.Sprint(c.MaxConcurrentRequests)
	}
	k := limitOf(c, 16)
	if k < 2 {
		note(r, "max_concurrent_requests %s: one at a time is what the agent announces", announced)
		return
	}
	// One request alone, three times: the agent's own time per request.
	var singles []time.Duration
	for i := 0; i < 3; i++ {
		_, _, _, _, took, err := burst(e, l, 1, "conc1")
		if err != nil {
			dirty = true
			worse(r, Fail, "a single request: %v", err)
			return
		}
		singles = append(singles, took)
	}
	sort.Slice(singles, func(i, j int) bool { return singles[i] < singles[j] })
	t1 := singles[1]
	// A Ping behind the burst tells an agent that handles events one at a
	// time (the Pong comes after every reply) from one that is only
	// short of CPU (the Pong overtakes most of them).
	ids, got, extra, ev, tk, err := burst(e, l, k, "concK", &protocol.Ping{Sequence: 1, TimestampMs: time.Now().UnixMilli()})
	r.Sent = append(ev[:1], fmt.Sprintf("… %d events and a Ping in one write, request_id %d … %d", k, ids[0], ids[len(ids)-1]))
	if err != nil {
		dirty = true
		worse(r, Fail, "%d requests at once: %v", k, err)
		return
	}
	before := k // replies that came before the Pong
	var pong *reply
	for _, x := range extra {
		if x.Type == protocol.TypePong {
			pong = x
			break
		}
	}
	if pong == nil {
		// Not yet read: it comes after every reply.
		for {
			x, err := l.Recv(e.cfg.Timeout)
			if err != nil {
				dirty = true
				worse(r, Fail, "no Pong to a Ping sent behind %d requests: %v", k, err)
				return
			}
			if x.Type == protocol.TypePong {
				break
			}
		}
	} else {
		before = 0
		for _, x := range got {
			if x.At.Before(pong.At) {
				before++
			}
		}
	}
	achieved := float64(k) * float64(t1) / float64(tk)
	detail := fmt.Sprintf("one request takes %v, %d at once take %v: about %.1f handled at a time; a Ping sent behind them was answered after %d of the %d replies (announced max_concurrent_requests: %s)",
		t1.Round(time.Microsecond), k, tk.Round(time.Microsecond), achieved, before, k, announced)
	// Below a few milliseconds per request the agent is fast enough that
	// concurrency cannot be measured this way (scheduling noise of a
	// loaded machine is of that order), nor does it matter much.
	if t1 >= 5*time.Millisecond && achieved < 1.5 && before >= k-1 {
		worse(r, Fail, "%s: the agent handles requests one at a time; declare max_concurrent_requests 1 or handle them concurrently (§7.6)", detail)
		return
	}
	note(r, "%s", detail)
}

// lateAfter is how long after a cancel a reply counts as work the agent
// did not stop: well above the round trip of an answer sent before the
// cancel was read.
func (e *env) lateAfter() time.Duration {
	return max(200*time.Millisecond, 20*e.pingRTT)
}

func checkCancel(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	dirty := false
	defer func() { e.release(l, dirty) }()
	c := l.Caps()
	if !c.SupportsCancellation {
		r.Status, r.Detail = Skip, "the agent does not declare supports_cancellation: the proxy never sends it CancelRequest (§7.8)"
		return
	}
	ev := firstEvent(c, 1, "/")
	if ev == nil {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	// A cancel for an id the agent never saw must be ignored (§7.8).
	unknown := &protocol.CancelRequest{RequestID: e.strays.forge(), Reason: []byte("client_disconnect")}
	s, err := l.Send(unknown)
	r.Sent = append(r.Sent, s...)
	if err == nil {
		err = stillServes(l, e.cfg.Timeout)
	}
	if err != nil {
		dirty = true
		worse(r, Fail, "after a CancelRequest for an unknown request_id the agent no longer answers a Ping: %v", err)
		return
	}
	id := nextID()
	s, err = l.Send(firstEvent(c, id, "/agentcheck/cancel"), &protocol.CancelRequest{RequestID: id, Reason: []byte("client_disconnect")})
	sentAt := time.Now()
	r.Sent = append(r.Sent, s...)
	if err != nil {
		dirty = true
		worse(r, Fail, "send: %v", err)
		return
	}
	judgeAfterCancel(e, l, r, map[uint64]bool{id: true}, sentAt, "CancelRequest", &dirty)
}

// judgeAfterCancel watches the replies to cancelled requests for the
// timeout: one soon after the cancel was sent was on its way before it
// was read; one much later is work the agent did not stop.
func judgeAfterCancel(e *env, l link, r *Result, ids map[uint64]bool, sentAt time.Time, what string, dirty *bool) {
	// Long enough to see a reply the agent did not stop, bounded by the
	// timeout.
	deadline := sentAt.Add(min(e.cfg.Timeout, 5*e.lateAfter()))
	early, late := 0, 0
	var lateBy time.Duration
	for time.Now().Before(deadline) {
		x, err := l.Recv(time.Until(deadline))
		if errors.Is(err, ErrTimeout) {
			break
		}
		if err != nil {
			*dirty = true
			if what == "CancelAll" {
				note(r, "the agent closed the connection after CancelAll")
				return
			}
			worse(r, Fail, "the connection ended after %s: %v", what, err)
			return
		}
		if !ids[x.ID] {
			continue
		}
		d := x.At.Sub(sentAt)
		if d > e.lateAfter() {
			late++
			lateBy = max(lateBy, d)
			r.Received = append(r.Received, x.Ev())
		} else {
			early++
		}
	}
	if late > 0 {
		worse(r, Warn, "%d replies came %v after the %s (a reply sent before the cancel was read comes within %v): the agent kept working on cancelled requests; it SHOULD stop and send no reply (§7.8)",
			late, lateBy.Round(time.Millisecond), what, e.lateAfter().Round(time.Millisecond))
		return
	}
	note(r, "%d of %d cancelled requests answered before the %s was read (allowed; the proxy drops them as late), none later", early, len(ids), what)
}

func checkCancelAll(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	dirty := true // the proxy closes a connection after CancelAll
	defer func() { e.release(l, dirty) }()
	c := l.Caps()
	if firstEvent(c, 1, "/") == nil {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	n := limitOf(c, 4)
	ids := map[uint64]bool{}
	var msgs []protocol.Message
	for i := 0; i < n; i++ {
		id := nextID()
		ids[id] = true
		msgs = append(msgs, firstEvent(c, id, fmt.Sprintf("/agentcheck/cancelall/%d", i)))
	}
	msgs = append(msgs, &protocol.CancelAll{Reason: []byte("shutdown")})
	s, err := l.Send(msgs...)
	sentAt := time.Now()
	r.Sent = append(s[:1], s[len(s)-1])
	if err != nil {
		worse(r, Fail, "send: %v", err)
		return
	}
	judgeAfterCancel(e, l, r, ids, sentAt, "CancelAll", &dirty)
}

// phaseProblem judges a reply to an event of the given phase.
func phaseProblem(x *reply, id uint64, body bool, phase protocol.Phase, idx uint32, inline bool) string {
	if x.Err != nil {
		return fmt.Sprintf("invalid reply: %v", x.Err)
	}
	switch x.Type {
	case protocol.TypeDecision:
		return ""
	case protocol.TypeBodyMutation:
		switch {
		case !body || inline:
			return "a BodyMutation answers a header event; it must be a Decision (§7.2, §8.5)"
		case x.Mut.Phase != phase:
			return fmt.Sprintf("BodyMutation of phase %s answers a %s body chunk (§8.5)", x.Mut.Phase, phase)
		case x.Mut.ChunkIndex != idx:
			return fmt.Sprintf("BodyMutation for chunk_index %d answers chunk %d (§8.5)", x.Mut.ChunkIndex, idx)
		}
		return ""
	}
	return fmt.Sprintf("a %s frame does not answer an event", x.Type)
}

func checkPhases(e *env, r *Result) {
	l := e.openFor(r)
	if l == nil {
		return
	}
	dirty := false
	defer func() { e.release(l, dirty) }()
	c := l.Caps()
	var flows []string
	step := func(m protocol.Message, id uint64, body bool, phase protocol.Phase, idx uint32, inline bool) *reply {
		s, err := l.Send(m)
		if err != nil {
			dirty = true
			worse(r, Fail, "send: %v", err)
			return nil
		}
		x, _, err := answer(l, id, e.cfg.Timeout)
		if err != nil {
			dirty = true
			r.Sent = append(r.Sent, s...)
			worse(r, Fail, "no answer to %s: %v (an agent SHOULD NOT leave an event unanswered, §4.13)", m.MsgType(), err)
			return nil
		}
		if p := phaseProblem(x, id, body, phase, idx, inline); p != "" {
			r.Sent = append(r.Sent, s...)
			r.Received = append(r.Received, x.Ev())
			worse(r, Fail, "%s: %s", m.MsgType(), p)
			return nil
		}
		return x
	}
	final := func(x *reply) bool { return x.Type == protocol.TypeDecision && x.Dec.Final() }
	// bodyFlow sends chunks until the agent's say ends.
	bodyFlow := func(label string, id uint64, phase protocol.Phase, from uint32) bool {
		chunks := [][]byte{[]byte("first chunk of the body, "), []byte("second chunk, "), []byte("and the last one.")}
		more := 0
		for i := int(from); i < len(chunks); i++ {
			last := i == len(chunks)-1
			var m protocol.Message = reqChunk(id, uint32(i), chunks[i], last)
			if phase == protocol.PhaseResponse {
				m = respChunk(id, uint32(i), chunks[i], last)
			}
			x := step(m, id, true, phase, uint32(i), false)
			if x == nil {
				return false
			}
			if final(x) {
				if last {
					flows = append(flows, fmt.Sprintf("%s: needs_more on %d chunks, final %s on the last", label, more, x.Dec.Kind))
				} else {
					flows = append(flows, fmt.Sprintf("%s: final %s at chunk %d of %d (ends its say)", label, x.Dec.Kind, i, len(chunks)))
				}
				return x.Dec.Kind == protocol.DecisionAllow
			}
			more++
		}
		flows = append(flows, fmt.Sprintf("%s: %d chunks, a BodyMutation or needs_more on each", label, len(chunks)))
		return true
	}
	allowed := true
	id := nextID()
	if c.HandlesRequestHeaders {
		x := step(reqHeaders(id, "POST", "/agentcheck/phases", c.HandlesRequestBody), id, false, protocol.PhaseRequest, 0, false)
		if x == nil {
			return
		}
		flows = append(flows, "request headers: "+x.Dec.Kind.String())
		allowed = x.Dec.Kind == protocol.DecisionAllow || x.Dec.Kind == protocol.DecisionNeedsMore
	}
	if c.HandlesRequestBody && allowed {
		if !bodyFlow("request body", id, protocol.PhaseRequest, 0) {
			if r.Status == Fail {
				return
			}
			allowed = false
		}
	}
	if !allowed {
		id = nextID() // the proxy would not go on with a blocked request
	}
	if c.HandlesResponseHeaders {
		x := step(respHeaders(id), id, false, protocol.PhaseResponse, 0, false)
		if x == nil {
			return
		}
		flows = append(flows, "response headers: "+x.Dec.Kind.String())
	}
	if c.HandlesResponseBody {
		if !bodyFlow("response body", id, protocol.PhaseResponse, 0) && r.Status == Fail {
			return
		}
	}
	if c.SupportsInlineBody && c.HandlesRequestHeaders && c.HandlesRequestBody {
		id := nextID()
		m := reqHeaders(id, "POST", "/agentcheck/inline", true)
		m.HasInlineBody = true
		m.InlineBody = protocol.BodyChunk{Data: []byte("first chunk, inline, "), TotalSize: -1, Progress: -1}
		x := step(m, id, true, protocol.PhaseRequest, 0, true)
		if x == nil {
			return
		}
		if !final(x) {
			if !bodyFlow("after the inline chunk", id, protocol.PhaseRequest, 1) && r.Status == Fail {
				return
			}
		}
		flows = append(flows, "inline body: "+x.Dec.Kind.String())
	}
	if len(flows) == 0 {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	note(r, "%s", strings.Join(flows, "; "))
}
