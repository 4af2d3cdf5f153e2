package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Handshake and registration happen once per connection, so they use
// encoding/json; only the structural check shares the hot scanner, so that
// every decoder rejects the same malformed payloads with the same errors.
// None of these functions checks protocol_version: callers do.

// appendJSON appends v as compact JSON without HTML escaping (encoding/json's
// default would turn '<' into \u003c, needlessly).
func appendJSON(dst []byte, v any) []byte {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Unreachable for these types: raw JSON is validated before encoding.
		return append(dst, '{', '}')
	}
	return append(dst, bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})...)
}

// rawOrNil returns raw when it is a single valid JSON value, else nil, so
// that a bad caller-supplied raw value is omitted instead of breaking the
// payload.
func rawOrNil(raw []byte) json.RawMessage {
	if len(raw) == 0 || !validJSON(raw) {
		return nil
	}
	return raw
}

// AppendHandshakeRequest appends the HandshakeRequest (0x01) payload of m;
// supported_features is written as [] when empty.
func AppendHandshakeRequest(dst []byte, m *HandshakeRequest) []byte {
	v := *m
	if v.SupportedFeatures == nil {
		v.SupportedFeatures = []string{}
	}
	return appendJSON(dst, &v)
}

// AppendHandshakeResponse appends the HandshakeResponse (0x02) payload of m;
// error is omitted when empty, max_concurrent_requests when 0 (no limit).
func AppendHandshakeResponse(dst []byte, m *HandshakeResponse) []byte {
	return appendJSON(dst, m)
}

type registrationRequestJSON struct {
	ProtocolVersion int             `json:"protocol_version"`
	AgentID         string          `json:"agent_id"`
	Capabilities    Capabilities    `json:"capabilities"`
	AuthToken       string          `json:"auth_token,omitempty"`
	Metadata        json.RawMessage `json:"metadata,omitempty"`
}

// AppendRegistrationRequest appends the RegistrationRequest (0x03) payload
// of m. metadata is written when non-empty and valid JSON.
func AppendRegistrationRequest(dst []byte, m *RegistrationRequest) []byte {
	return appendJSON(dst, &registrationRequestJSON{
		ProtocolVersion: m.ProtocolVersion,
		AgentID:         m.AgentID,
		Capabilities:    m.Capabilities,
		AuthToken:       m.AuthToken,
		Metadata:        rawOrNil(m.Metadata),
	})
}

type registrationResponseJSON struct {
	Accepted        bool            `json:"accepted"`
	Error           string          `json:"error,omitempty"`
	AssignedID      string          `json:"assigned_id,omitempty"`
	PayloadEncoding string          `json:"payload_encoding,omitempty"`
	Config          json.RawMessage `json:"config,omitempty"`
}

// AppendRegistrationResponse appends the RegistrationResponse (0x04) payload
// of m. config is written when non-empty and valid JSON.
func AppendRegistrationResponse(dst []byte, m *RegistrationResponse) []byte {
	return appendJSON(dst, &registrationResponseJSON{
		Accepted:        m.Accepted,
		Error:           m.Error,
		AssignedID:      m.AssignedID,
		PayloadEncoding: encodingOut(m.PayloadEncoding),
		Config:          rawOrNil(m.Config),
	})
}

// encodingOut writes the default encoding as absent, so that a JSON
// connection's response stays the seed's shape.
func encodingOut(enc string) string {
	if enc == EncodingJSON {
		return ""
	}
	return enc
}

// clipName bounds a peer's unknown value before it reaches an error.
func clipName(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}

// checkObject applies the hot decoders' structural rules (one JSON object,
// valid UTF-8, nesting limit, nothing after it) without modifying payload.
func checkObject(payload []byte) error {
	s := newScanner(payload)
	if s.peek() != '{' {
		return fmt.Errorf("%w: payload is not a JSON object", ErrProtocolSyntax)
	}
	if err := s.skip(); err != nil {
		return err
	}
	return s.end()
}

// unmarshal decodes a checked payload, mapping encoding/json's errors onto
// the protocol sentinels.
func unmarshal(payload []byte, v any) error {
	if err := checkObject(payload); err != nil {
		return err
	}
	err := json.Unmarshal(payload, v)
	if err == nil {
		return nil
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Errorf("%w: %s: expected %s", ErrProtocolField, te.Field, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Errorf("%w: at offset %d", ErrProtocolSyntax, se.Offset)
	}
	return fmt.Errorf("%w: %v", ErrProtocolField, err)
}

// compactRaw returns a compacted copy of a raw JSON value, nil for absent
// or null, so that a decoded value re-encodes byte for byte.
func compactRaw(raw json.RawMessage) []byte {
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return nil // unreachable: the payload was checked
	}
	return buf.Bytes()
}

// DecodeHandshakeRequest parses a HandshakeRequest payload into m.
func DecodeHandshakeRequest(payload []byte, m *HandshakeRequest) error {
	*m = HandshakeRequest{}
	return unmarshal(payload, m)
}

type handshakeResponseJSON struct {
	ProtocolVersion int          `json:"protocol_version"`
	AgentName       string       `json:"agent_name"`
	Accepted        *bool        `json:"accepted"`
	Error           string       `json:"error"`
	Capabilities    Capabilities `json:"capabilities"`
}

// DecodeHandshakeResponse parses a HandshakeResponse payload into m. An
// absent (or null) "accepted" is an acceptance, as in the seed's shape;
// "accepted": false or a non-empty "error" is a refusal. An absent or null
// max_concurrent_requests reads as 0 (no agent-side limit).
func DecodeHandshakeResponse(payload []byte, m *HandshakeResponse) error {
	*m = HandshakeResponse{}
	var v handshakeResponseJSON
	if err := unmarshal(payload, &v); err != nil {
		return err
	}
	*m = HandshakeResponse{
		ProtocolVersion: v.ProtocolVersion,
		AgentName:       v.AgentName,
		Accepted:        (v.Accepted == nil || *v.Accepted) && v.Error == "",
		Error:           v.Error,
		Capabilities:    v.Capabilities,
	}
	return nil
}

// DecodeRegistrationRequest parses a RegistrationRequest payload into m;
// metadata is kept as compacted raw JSON (nil when absent or null).
func DecodeRegistrationRequest(payload []byte, m *RegistrationRequest) error {
	*m = RegistrationRequest{}
	var v registrationRequestJSON
	if err := unmarshal(payload, &v); err != nil {
		return err
	}
	*m = RegistrationRequest{
		ProtocolVersion: v.ProtocolVersion,
		AgentID:         v.AgentID,
		Capabilities:    v.Capabilities,
		AuthToken:       v.AuthToken,
		Metadata:        compactRaw(v.Metadata),
	}
	return nil
}

// DecodeRegistrationResponse parses a RegistrationResponse payload into m.
// Unlike the handshake, an absent "accepted" is a refusal (the seed's
// RegistrationResponse always carries it), and so is a non-empty "error".
// config is kept as compacted raw JSON (nil when absent or null).
func DecodeRegistrationResponse(payload []byte, m *RegistrationResponse) error {
	*m = RegistrationResponse{}
	var v registrationResponseJSON
	if err := unmarshal(payload, &v); err != nil {
		return err
	}
	*m = RegistrationResponse{
		Accepted:   v.Accepted && v.Error == "",
		Error:      v.Error,
		AssignedID: v.AssignedID,
		Config:     compactRaw(v.Config),
	}
	switch v.PayloadEncoding {
	case "", EncodingJSON:
	case EncodingProtobuf:
		m.PayloadEncoding = EncodingProtobuf
	default:
		return fmt.Errorf("%w: payload_encoding: unknown encoding %q", ErrProtocolField, clipName(v.PayloadEncoding))
	}
	return nil
}
