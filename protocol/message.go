package protocol

// Message is one protocol message as a sender hands it to a transport: it
// names its own frame type and appends its own JSON payload, so a frame's
// type byte always comes from the message it carries. Every message type
// implements it with pointer receivers; converting a *T to a Message does
// not allocate.
//
// Two frame types share a payload struct each: a BodyChunk is sent as a
// RequestBodyChunk or a ResponseBodyChunk (see BodyChunk.As), and a Ping
// is answered with a Pong, the same payload under its own type.
type Message interface {
	// MsgType is the frame type the message travels as.
	MsgType() MsgType
	// AppendJSON appends the message's JSON payload (no frame header) to
	// dst. With a dst of sufficient capacity the hot messages do not
	// allocate.
	AppendJSON(dst []byte) ([]byte, error)
}

// RequestBodyChunk is a BodyChunk sent as frame type 0x11.
type RequestBodyChunk BodyChunk

// ResponseBodyChunk is a BodyChunk sent as frame type 0x13.
type ResponseBodyChunk BodyChunk

// Pong (0xF1) answers a Ping by echoing its payload.
type Pong Ping

// As returns m as the Message of phase p: a *RequestBodyChunk or a
// *ResponseBodyChunk sharing m's storage.
func (m *BodyChunk) As(p Phase) Message {
	if p == PhaseResponse {
		return (*ResponseBodyChunk)(m)
	}
	return (*RequestBodyChunk)(m)
}

// MsgType implements Message.
func (*HandshakeRequest) MsgType() MsgType { return TypeHandshakeRequest }

// MsgType implements Message.
func (*HandshakeResponse) MsgType() MsgType { return TypeHandshakeResponse }

// MsgType implements Message.
func (*RegistrationRequest) MsgType() MsgType { return TypeRegistrationRequest }

// MsgType implements Message.
func (*RegistrationResponse) MsgType() MsgType { return TypeRegistrationResponse }

// MsgType implements Message.
func (*RequestHeaders) MsgType() MsgType { return TypeRequestHeaders }

// MsgType implements Message.
func (*RequestBodyChunk) MsgType() MsgType { return TypeRequestBodyChunk }

// MsgType implements Message.
func (*ResponseHeaders) MsgType() MsgType { return TypeResponseHeaders }

// MsgType implements Message.
func (*ResponseBodyChunk) MsgType() MsgType { return TypeResponseBodyChunk }

// MsgType implements Message.
func (*Decision) MsgType() MsgType { return TypeDecision }

// MsgType implements Message.
func (*BodyMutation) MsgType() MsgType { return TypeBodyMutation }

// MsgType implements Message.
func (*CancelRequest) MsgType() MsgType { return TypeCancelRequest }

// MsgType implements Message.
func (*CancelAll) MsgType() MsgType { return TypeCancelAll }

// MsgType implements Message.
func (*Ping) MsgType() MsgType { return TypePing }

// MsgType implements Message.
func (*Pong) MsgType() MsgType { return TypePong }

// AppendJSON implements Message (AppendHandshakeRequest).
func (m *HandshakeRequest) AppendJSON(dst []byte) ([]byte, error) {
	return AppendHandshakeRequest(dst, m), nil
}

// AppendJSON implements Message (AppendHandshakeResponse).
func (m *HandshakeResponse) AppendJSON(dst []byte) ([]byte, error) {
	return AppendHandshakeResponse(dst, m), nil
}

// AppendJSON implements Message (AppendRegistrationRequest).
func (m *RegistrationRequest) AppendJSON(dst []byte) ([]byte, error) {
	return AppendRegistrationRequest(dst, m), nil
}

// AppendJSON implements Message (AppendRegistrationResponse).
func (m *RegistrationResponse) AppendJSON(dst []byte) ([]byte, error) {
	return AppendRegistrationResponse(dst, m), nil
}

// AppendJSON implements Message (AppendRequestHeaders).
func (m *RequestHeaders) AppendJSON(dst []byte) ([]byte, error) {
	return AppendRequestHeaders(dst, m), nil
}

// AppendJSON implements Message (AppendBodyChunk with "bytes_received").
func (m *RequestBodyChunk) AppendJSON(dst []byte) ([]byte, error) {
	return AppendBodyChunk(dst, (*BodyChunk)(m), TypeRequestBodyChunk), nil
}

// AppendJSON implements Message (AppendResponseHeaders).
func (m *ResponseHeaders) AppendJSON(dst []byte) ([]byte, error) {
	return AppendResponseHeaders(dst, m), nil
}

// AppendJSON implements Message (AppendBodyChunk with "bytes_sent").
func (m *ResponseBodyChunk) AppendJSON(dst []byte) ([]byte, error) {
	return AppendBodyChunk(dst, (*BodyChunk)(m), TypeResponseBodyChunk), nil
}

// AppendJSON implements Message (AppendDecision).
func (m *Decision) AppendJSON(dst []byte) ([]byte, error) { return AppendDecision(dst, m), nil }

// AppendJSON implements Message (AppendBodyMutation).
func (m *BodyMutation) AppendJSON(dst []byte) ([]byte, error) {
	return AppendBodyMutation(dst, m), nil
}

// AppendJSON implements Message (AppendCancelRequest).
func (m *CancelRequest) AppendJSON(dst []byte) ([]byte, error) {
	return AppendCancelRequest(dst, m), nil
}

// AppendJSON implements Message (AppendCancelAll).
func (m *CancelAll) AppendJSON(dst []byte) ([]byte, error) { return AppendCancelAll(dst, m), nil }

// AppendJSON implements Message (AppendPing).
func (m *Ping) AppendJSON(dst []byte) ([]byte, error) { return AppendPing(dst, m), nil }

// AppendJSON implements Message (AppendPing: a Pong echoes the Ping).
func (m *Pong) AppendJSON(dst []byte) ([]byte, error) { return AppendPing(dst, (*Ping)(m)), nil }

// Every message type is a Message.
var (
	_ Message = (*HandshakeRequest)(nil)
	_ Message = (*HandshakeResponse)(nil)
	_ Message = (*RegistrationRequest)(nil)
	_ Message = (*RegistrationResponse)(nil)
	_ Message = (*RequestHeaders)(nil)
	_ Message = (*RequestBodyChunk)(nil)
	_ Message = (*ResponseHeaders)(nil)
	_ Message = (*ResponseBodyChunk)(nil)
	_ Message = (*Decision)(nil)
	_ Message = (*BodyMutation)(nil)
	_ Message = (*CancelRequest)(nil)
	_ Message = (*CancelAll)(nil)
	_ Message = (*Ping)(nil)
	_ Message = (*Pong)(nil)
)
