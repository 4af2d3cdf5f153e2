// Package pbwiretest is the suite of messages the tests of the
// AgentMessage wire format share: those of internal/pbwire (the hand
// codec, held to the generated code of agent.proto) and of the gRPC codec
// and outbox over it (internal/grpcwire). It holds one of every message a
// stream carries, their typed form, a canonical rendering for comparisons
// and the hand decoder's reading of wire bytes.
package pbwiretest

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/zentinelproxy/sidecar/internal/pbwire"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Case is one message of the suite: its name, its type and the message
// (a *protocol.BodyChunk or *protocol.Ping stands for either phase or
// direction; see AsMessage).
type Case struct {
	Name string
	Type protocol.MsgType
	Msg  any
}

// Messages is one of every message a stream carries, with every field
// set somewhere, in the form a decoder followed (for a Decision) by
// protocol.Decision.Normalize produces them.
func Messages() []Case {
	binary := make([]byte, 256)
	for i := range binary {
		binary[i] = byte(i)
	}
	return []Case{
		{"request headers", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 1<<63 + 5, Method: b("POST"), URI: b("/api/users?id=7&x=\xff"), HasBody: true,
			Headers: hdrs("host", "example.com", "accept", "*/*", "x-bin", "\x80\xfe", "accept", "text/html", "x-empty", ""),
			Metadata: protocol.Metadata{
				CorrelationID: b("b9e2"), ClientIP: b("10.0.0.9"), ClientPort: 51234, Protocol: b("HTTP/2"),
				ServerName: b("example.com"), RouteID: b("default"), UpstreamID: b("app"),
				Traceparent: b("00-ab-cd-01"), Timestamp: b("2026-11-21T10:00:00Z"),
			},
		}},
		{"request headers tls", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 9, Method: b("GET"), URI: b("/ws"), Headers: hdrs("host", "api.example.com", "upgrade", "websocket"),
			Metadata: protocol.Metadata{
				ClientIP: b("10.0.0.9"), Protocol: b("HTTP/1.1"), ServerName: b("api.example.com"),
				TLSVersion: b("TLS1.3"), TLSCipher: b("TLS_AES_128_GCM_SHA256"), TLSServerName: b("api.example.com"),
				TLSClientSubject: b("CN=billing,O=Example"), TLSClientSAN: b("DNS:billing.internal,URI:spiffe://example.org/billing"),
			},
		}},
		{"request headers minimal", protocol.TypeRequestHeaders, &protocol.RequestHeaders{RequestID: 2, Method: b("GET"), URI: b("/")}},
		{"request chunk", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 3, ChunkIndex: 7, Data: binary, IsLast: true, TotalSize: 4096, Progress: 2048}},
		{"request chunk unknown sizes", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 3, Data: b("x"), TotalSize: -1, Progress: -1}},
		{"request chunk zero total", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 3, TotalSize: 0, Progress: 0}},
		{"response headers", protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: 4, StatusCode: 204, Headers: hdrs("content-type", "text/html", "set-cookie", "a=1", "set-cookie", "b=2"), HasBody: true}},
		{"response chunk", protocol.TypeResponseBodyChunk, &protocol.BodyChunk{RequestID: 5, ChunkIndex: 1, Data: b("hello"), TotalSize: -1, Progress: 10}},
		{"decision allow", protocol.TypeDecision, &protocol.Decision{RequestID: 6, Kind: protocol.DecisionAllow}},
		{"decision allow full", protocol.TypeDecision, &protocol.Decision{
			RequestID: 6, Kind: protocol.DecisionAllow, NeedsMore: true,
			RequestHeaderOps: []protocol.HeaderOp{
				{Op: protocol.HeaderSet, Name: b("x-user"), Value: b("42")},
				{Op: protocol.HeaderRemove, Name: b("cookie")},
				{Op: protocol.HeaderAdd, Name: b("x-empty"), Value: b("")},
			},
			ResponseHeaderOps:       []protocol.HeaderOp{{Op: protocol.HeaderAdd, Name: b("x-frame-options"), Value: b("DENY")}},
			HasRequestBodyMutation:  true,
			RequestBodyMutation:     protocol.BodyMutation{RequestID: 6, Phase: protocol.PhaseRequest, ChunkIndex: 2, Action: protocol.MutationReplace, Data: b("r")},
			HasResponseBodyMutation: true,
			ResponseBodyMutation:    protocol.BodyMutation{RequestID: 6, Phase: protocol.PhaseResponse, ChunkIndex: 0, Action: protocol.MutationDrop},
			Audit: protocol.Audit{
				Tags: [][]byte{b("sqli"), b("xss")}, RuleIDs: [][]byte{b("942100")}, Confidence: 0, HasConf: true,
				ReasonCodes: [][]byte{b("R1")}, Custom: b(`{"k":[1,2]}`),
			},
		}},
		{"decision block", protocol.TypeDecision, &protocol.Decision{RequestID: 7, Kind: protocol.DecisionBlock, Status: 451, Body: b("denied"), BlockHeaders: hdrs("x-reason", "policy")}},
		{"decision block no_store", protocol.TypeDecision, &protocol.Decision{RequestID: 7, Kind: protocol.DecisionBlock, Status: 403, Cache: protocol.CacheDirective{NoStore: true}}},
		{"decision allow cached", protocol.TypeDecision, &protocol.Decision{RequestID: 7, Kind: protocol.DecisionAllow, Cache: protocol.CacheDirective{TTLMs: 30000}}},
		{"decision redirect", protocol.TypeDecision, &protocol.Decision{RequestID: 8, Kind: protocol.DecisionRedirect, Status: 308, RedirectURL: b("https://login.example.com/")}},
		{"decision needs_more", protocol.TypeDecision, &protocol.Decision{RequestID: 9, Kind: protocol.DecisionNeedsMore, NeedsMore: true}},
		{"mutation pass", protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 10, ChunkIndex: 1, Action: protocol.MutationPass}},
		{"mutation drop", protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 10, ChunkIndex: 2, Action: protocol.MutationDrop, Phase: protocol.PhaseResponse}},
		{"mutation replace", protocol.TypeBodyMutation, &protocol.BodyMutation{RequestID: 10, ChunkIndex: 3, Action: protocol.MutationReplace, Data: binary}},
		{"cancel", protocol.TypeCancelRequest, &protocol.CancelRequest{RequestID: 11, Reason: b("client_disconnect")}},
		{"cancel all", protocol.TypeCancelAll, &protocol.CancelAll{Reason: b("shutdown")}},
		{"ping", protocol.TypePing, &protocol.Ping{Sequence: 7, TimestampMs: 1763719200000}},
		{"pong", protocol.TypePong, &protocol.Ping{Sequence: 8, TimestampMs: -1}},
		{"request headers inline body", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 12, Method: b("POST"), URI: b("/upload"), HasBody: true, Headers: hdrs("host", "example.com", "content-length", "256"),
			HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: binary, IsLast: true, TotalSize: 256, Progress: 256},
		}},
		{"request headers inline first chunk", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 13, Method: b("POST"), URI: b("/"), HasBody: true,
			HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: b("first"), TotalSize: -1, Progress: -1},
		}},
		{"request headers inline empty", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 14, Method: b("POST"), URI: b("/"), HasBody: true,
			HasInlineBody: true, InlineBody: protocol.BodyChunk{IsLast: true, TotalSize: 0, Progress: 0},
		}},
		{"request headers timeout", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 15, TimeoutMs: 1000, Method: b("POST"), URI: b("/"), HasBody: true,
			HasInlineBody: true, InlineBody: protocol.BodyChunk{Data: b("first"), TotalSize: -1, Progress: -1},
		}},
		{"request chunk timeout", protocol.TypeRequestBodyChunk, &protocol.BodyChunk{RequestID: 15, TimeoutMs: 850, ChunkIndex: 1, Data: b("x"), IsLast: true, TotalSize: -1, Progress: -1}},
		{"response headers timeout", protocol.TypeResponseHeaders, &protocol.ResponseHeaders{RequestID: 15, TimeoutMs: 4294967295, StatusCode: 200}},
		{"response chunk timeout", protocol.TypeResponseBodyChunk, &protocol.BodyChunk{RequestID: 15, TimeoutMs: 1, Data: b("y"), TotalSize: -1, Progress: -1}},
		{"request headers client", protocol.TypeRequestHeaders, &protocol.RequestHeaders{
			RequestID: 12, Method: b("POST"), URI: b("/upload?x=1"), RequestTarget: b("http://Example.COM./upload?x=1"), HasBody: true,
			Headers: hdrs("host", "example.com", "transfer-encoding", "chunked", "connection", "keep-alive, x-hop", "x-hop", "1", "x-forwarded-for", "203.0.113.9"),
			Metadata: protocol.Metadata{
				ClientIP: b("192.0.2.7"), ClientPort: 51234, Protocol: b("HTTP/1.1"), ServerName: b("example.com"),
				ServerIP: b("10.0.0.2"), ServerPort: 8080, ListenerID: b("public"), UpstreamHost: b("app.internal:9000"),
				ForwardedFor: b("192.0.2.7"), ForwardedProto: b("http"), ForwardedHost: b("example.com"), Path: b("/upload"),
			},
		}},
	}
}

// AsMessage turns the (type, message) pairs of the tables into the typed
// Message that carries them: a BodyChunk in the phase of t, a Ping as a
// Pong for TypePong. A pair that does not match panics.
func AsMessage(t protocol.MsgType, msg any) protocol.Message {
	switch m := msg.(type) {
	case *protocol.BodyChunk:
		if t == protocol.TypeResponseBodyChunk {
			return m.As(protocol.PhaseResponse)
		}
		return m.As(protocol.PhaseRequest)
	case *protocol.Ping:
		if t == protocol.TypePong {
			return (*protocol.Pong)(m)
		}
		return m
	case protocol.Message:
		if m.MsgType() != t {
			panic(fmt.Sprintf("test table pairs %T with %s", msg, t))
		}
		return m
	}
	panic(fmt.Sprintf("test table: %T is not a message", msg))
}

// Canon renders a protocol message for comparison: exported fields only,
// nil and empty byte slices alike.
func Canon(v any) string {
	var sb strings.Builder
	canonValue(&sb, reflect.ValueOf(v))
	return sb.String()
}

func canonValue(sb *strings.Builder, v reflect.Value) {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			sb.WriteString("nil")
			return
		}
		canonValue(sb, v.Elem())
	case reflect.Struct:
		sb.WriteString("{")
		for i := 0; i < v.NumField(); i++ {
			if !v.Type().Field(i).IsExported() {
				continue
			}
			sb.WriteString(v.Type().Field(i).Name + ":")
			canonValue(sb, v.Field(i))
			sb.WriteString(" ")
		}
		sb.WriteString("}")
	case reflect.Slice:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			fmt.Fprintf(sb, "%q", v.Bytes())
			return
		}
		sb.WriteString("[")
		for i := 0; i < v.Len(); i++ {
			canonValue(sb, v.Index(i))
			sb.WriteString(",")
		}
		sb.WriteString("]")
	default:
		fmt.Fprintf(sb, "%v", v.Interface())
	}
}

// Decode decodes wire bytes with the hand decoder (pbwire.Frame) into the
// protocol message a frame of type t carries.
func Decode(t protocol.MsgType, wire []byte) (any, error) {
	var f pbwire.Frame
	f.Parse(bytes.Clone(wire))
	if f.Err != nil {
		return nil, f.Err
	}
	var err error
	switch f.Payload {
	case pbwire.PayloadRequestHeaders:
		var m protocol.RequestHeaders
		err = f.DecodeRequestHeaders(&m)
		return &m, err
	case pbwire.PayloadRequestBodyChunk, pbwire.PayloadResponseBodyChunk:
		var m protocol.BodyChunk
		err = f.DecodeBodyChunk(&m)
		return &m, err
	case pbwire.PayloadResponseHeaders:
		var m protocol.ResponseHeaders
		err = f.DecodeResponseHeaders(&m)
		return &m, err
	case pbwire.PayloadDecision:
		var m protocol.Decision
		err = f.DecodeDecision(&m)
		return &m, err
	case pbwire.PayloadBodyMutation:
		var m protocol.BodyMutation
		err = f.DecodeBodyMutation(&m)
		return &m, err
	case pbwire.PayloadCancel:
		var m protocol.CancelRequest
		err = f.DecodeCancel(&m)
		return &m, err
	case pbwire.PayloadCancelAll:
		var m protocol.CancelAll
		err = f.DecodeCancelAll(&m)
		return &m, err
	case pbwire.PayloadPing, pbwire.PayloadPong:
		var m protocol.Ping
		err = f.DecodePing(&m)
		return &m, err
	}
	return nil, errors.New("no payload")
}

func hdrs(kv ...string) protocol.Headers {
	var h protocol.Headers
	for i := 0; i+1 < len(kv); i += 2 {
		h = h.Add([]byte(kv[i]), []byte(kv[i+1]))
	}
	return h
}

func b(s string) []byte { return []byte(s) }
