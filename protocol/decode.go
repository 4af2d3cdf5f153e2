package protocol

import (
	"bytes"
	"math"
)

// Decoding contract (all hot messages):
//
//   - Decode resets m, copies the payload into a buffer owned by m and parses
//     that copy in place: the payload passed in is never modified or kept.
//   - Every []byte field of the result (and the Headers, HeaderOps and audit
//     lists) points into m's buffer and stays valid until the next Decode
//     into m or its Reset. Copy what must outlive that. The slices are capped,
//     so appending to one never overwrites its neighbours.
//   - In steady state (buffers grown to the message sizes seen) Decode does
//     not allocate.
//   - On error m's fields are unspecified (partly decoded); m stays fit for
//     the next Decode. Use PeekRequestID on the payload to route the error
//     to its request.
//   - Unknown keys are skipped; null reads as "absent" for every field.
//   - Decoding is purely syntactic: a decoder reports malformed input
//     (syntax, wrong types, numbers out of their type's range, unknown
//     enum names, JSON shapes the schema does not have) and applies no
//     default and no rule between fields. A decoded Decision gets those
//     from Decision.Normalize (normalize.go), the one place for them.

// maxRetainedRaw bounds the buffer a message keeps between decodes: after a
// larger payload, the next smaller one drops the big buffer instead of
// pinning it for the life of a pooled message.
const maxRetainedRaw = 1 << 20

func loadRaw(raw, payload []byte) []byte {
	if cap(raw) > maxRetainedRaw && len(payload) <= maxRetainedRaw {
		raw = nil
	}
	return append(raw[:0], payload...)
}

const (
	maxInt32 = math.MaxInt32
	minInt32 = math.MinInt32
)

// Decode parses a RequestHeaders payload into m. Header names are
// lower-cased in place; headers may come as the object form
// {"name":["v1","v2"]} (a single string is accepted for a value list) or as
// the seed's pair list [["name","value"],...].
func (m *RequestHeaders) Decode(payload []byte) error {
	m.Reset()
	m.raw = loadRaw(m.raw, payload)
	s := newScanner(m.raw)
	return s.document(func(key []byte) (err error) {
		switch string(key) {
		case "request_id":
			m.RequestID, _, err = s.u64("request_id", math.MaxUint64)
		case "timeout_ms":
			m.TimeoutMs, err = s.timeoutMs()
		case "method":
			m.Method, err = s.strVal("method")
		case "uri":
			m.URI, err = s.strVal("uri")
		case "request_target":
			m.RequestTarget, err = s.strVal("request_target")
		case "has_body":
			m.HasBody, err = s.boolVal("has_body")
		case "headers":
			m.Headers, err = s.headers(m.Headers[:0], "headers", true)
		case "metadata":
			err = s.metadata(&m.Metadata)
		case "inline_body":
			m.HasInlineBody, err = s.inlineBody(&m.InlineBody)
		default:
			err = s.skip()
		}
		return err
	})
}

func (s *scanner) metadata(md *Metadata) error {
	*md = Metadata{}
	_, err := s.nested("metadata", ctxMetadata, func(key []byte) (err error) {
		switch string(key) {
		case "correlation_id":
			md.CorrelationID, err = s.strVal("correlation_id")
		case "client_ip":
			md.ClientIP, err = s.strVal("client_ip")
		case "client_port":
			var p int64
			p, _, err = s.i64("client_port", 0, 65535)
			md.ClientPort = int(p)
		case "protocol":
			md.Protocol, err = s.strVal("protocol")
		case "server_name":
			md.ServerName, err = s.strVal("server_name")
		case "route_id":
			md.RouteID, err = s.strVal("route_id")
		case "upstream_id":
			md.UpstreamID, err = s.strVal("upstream_id")
		case "traceparent":
			md.Traceparent, err = s.strVal("traceparent")
		case "timestamp":
			md.Timestamp, err = s.strVal("timestamp")
		case "tls_version":
			md.TLSVersion, err = s.strVal("tls_version")
		case "tls_cipher":
			md.TLSCipher, err = s.strVal("tls_cipher")
		case "tls_server_name":
			md.TLSServerName, err = s.strVal("tls_server_name")
		case "tls_client_subject":
			md.TLSClientSubject, err = s.strVal("tls_client_subject")
		case "tls_client_san":
			md.TLSClientSAN, err = s.strVal("tls_client_san")
		case "server_ip":
			md.ServerIP, err = s.strVal("server_ip")
		case "server_port":
			var p int64
			p, _, err = s.i64("server_port", 0, 65535)
			md.ServerPort = int(p)
		case "listener_id":
			md.ListenerID, err = s.strVal("listener_id")
		case "upstream_host":
			md.UpstreamHost, err = s.strVal("upstream_host")
		case "path":
			md.Path, err = s.strVal("path")
		case "forwarded_for":
			md.ForwardedFor, err = s.strVal("forwarded_for")
		case "forwarded_proto":
			md.ForwardedProto, err = s.strVal("forwarded_proto")
		case "forwarded_host":
			md.ForwardedHost, err = s.strVal("forwarded_host")
		default:
			err = s.skip()
		}
		return err
	})
	return err
}

// headers reads a header collection in any accepted shape and appends it to
// h: an object name → [values] or name → value, or a list of [name, value]
// pairs or {"name":..,"value":..} objects. Null values are dropped. Numbers
// are accepted as values and kept as their literal text.
func (s *scanner) headers(h Headers, field string, lowerNames bool) (Headers, error) {
	switch s.peek() {
	case 'n':
		if s.null() {
			return h, nil
		}
	case '{':
		s.i++
		if err := s.enter(); err != nil {
			return h, err
		}
		err := s.members(func(name []byte) error {
			if lowerNames {
				lower(name)
			}
			if s.peek() != '[' {
				v, err := s.text(field)
				if v != nil {
					if len(h) >= MaxListEntries {
						return s.tooMany(field)
					}
					h = append(h, Header{Name: name, Value: v})
				}
				return err
			}
			s.i++
			if err := s.enter(); err != nil {
				return err
			}
			for k := 0; ; {
				more, err := s.elem(&k)
				if err != nil || !more {
					return err
				}
				v, err := s.text(field)
				if err != nil {
					return err
				}
				if v != nil {
					if len(h) >= MaxListEntries {
						return s.tooMany(field)
					}
					h = append(h, Header{Name: name, Value: v})
				}
			}
		})
		return h, err
	case '[':
		s.i++
		if err := s.enter(); err != nil {
			return h, err
		}
		for n := 0; ; {
			more, err := s.elem(&n)
			if err != nil {
				return h, err
			}
			if !more {
				return h, nil
			}
			var name, value []byte
			switch s.peek() {
			case '[':
				name, value, err = s.headerPair(field)
			case '{':
				if name, value, err = s.headerObject(field); err == nil && name == nil {
					err = s.fieldErr(field, "header without name")
				}
			default:
				err = s.typeErr(field, "[name, value] pair")
			}
			if err != nil {
				return h, err
			}
			if value == nil {
				continue
			}
			if lowerNames {
				lower(name)
			}
			if len(h) >= MaxListEntries {
				return h, s.tooMany(field)
			}
			h = append(h, Header{Name: name, Value: value})
		}
	}
	return h, s.typeErr(field, "object")
}

// headerPair reads ["name","value"].
func (s *scanner) headerPair(field string) (name, value []byte, err error) {
	s.i++
	if err = s.enter(); err != nil {
		return nil, nil, err
	}
	var n int
	for part := 0; ; part++ {
		more, err := s.elem(&n)
		if err != nil {
			return nil, nil, err
		}
		if !more {
			if part != 2 {
				return nil, nil, s.fieldErr(field, "expected [name, value] pair")
			}
			return name, value, nil
		}
		switch part {
		case 0:
			if s.peek() != '"' {
				return nil, nil, s.typeErr(field, "header name string")
			}
			name, err = s.str()
		case 1:
			value, err = s.text(field)
		default:
			return nil, nil, s.fieldErr(field, "expected [name, value] pair")
		}
		if err != nil {
			return nil, nil, err
		}
	}
}

// headerObject reads {"name":..,"value":..}; name is nil when absent.
func (s *scanner) headerObject(field string) (name, value []byte, err error) {
	s.i++
	if err = s.enter(); err != nil {
		return nil, nil, err
	}
	err = s.members(func(key []byte) (err error) {
		switch string(key) {
		case "name":
			if s.peek() != '"' {
				return s.typeErr(field, "header name string")
			}
			name, err = s.str()
		case "value":
			value, err = s.text(field)
		default:
			err = s.skip()
		}
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	return name, value, nil
}

// Decode parses a body chunk payload (either direction) into m. data may be
// absent or null (empty chunk); total_size and bytes_received/bytes_sent
// stay -1 when absent or null.
func (m *BodyChunk) Decode(payload []byte) error {
	m.Reset()
	m.raw = loadRaw(m.raw, payload)
	s := newScanner(m.raw)
	return s.document(s.chunkFields(m))
}

// chunkFields returns the member reader of a body chunk object (for
// document or nested). RequestHeaders uses it for its inline body too, so
// that the chunk's data is decoded in place in the event's buffer. It is
// inlined: the closure stays on the caller's stack.
func (s *scanner) chunkFields(m *BodyChunk) func(key []byte) error {
	return func(key []byte) (err error) {
		switch string(key) {
		case "request_id":
			m.RequestID, _, err = s.u64("request_id", math.MaxUint64)
		case "timeout_ms":
			m.TimeoutMs, err = s.timeoutMs()
		case "chunk_index":
			var v uint64
			v, _, err = s.u64("chunk_index", math.MaxUint32)
			m.ChunkIndex = uint32(v)
		case "data":
			m.Data, err = s.base64Val("data")
		case "is_last":
			m.IsLast, err = s.boolVal("is_last")
		case "total_size":
			m.TotalSize, err = s.size("total_size")
		case "bytes_received":
			m.Progress, err = s.size("bytes_received")
		case "bytes_sent":
			m.Progress, err = s.size("bytes_sent")
		default:
			err = s.skip()
		}
		return err
	}
}

// timeoutMs reads an event's timeout_ms, a u32; null reads as 0 (unknown).
func (s *scanner) timeoutMs() (uint32, error) {
	v, _, err := s.u64("timeout_ms", math.MaxUint32)
	return uint32(v), err
}

// size reads a non-negative byte count; null reads as -1 (unknown).
func (s *scanner) size(field string) (int64, error) {
	v, ok, err := s.i64(field, 0, math.MaxInt64)
	if !ok {
		return -1, err
	}
	return v, nil
}

// base64Val reads a base64 string and decodes it in place; null reads as nil.
func (s *scanner) base64Val(field string) ([]byte, error) {
	// Fast path for the usual string without escapes: find the closing
	// quote with IndexByte (vectorised) and let the base64 decoder, whose
	// alphabet excludes control characters and non-ASCII bytes, do the
	// string validation too, instead of a separate pass over the data.
	if s.peek() == '"' {
		start := s.i + 1
		if q := bytes.IndexByte(s.b[start:], '"'); q >= 0 && bytes.IndexByte(s.b[start:start+q], '\\') < 0 {
			seg := s.b[start : start+q]
			n, ok, untouched := decodeBase64InPlace(seg)
			if ok {
				s.i = start + q + 1
				return seg[:n:n], nil
			}
			// Not base64: tell a malformed JSON string from bad base64 by
			// scanning what the decoder left untouched (what it overwrote
			// were valid symbols).
			s.i = start + untouched - 1
			if _, _, _, err := s.span(); err != nil {
				return nil, err
			}
			return nil, s.fieldErr(field, "invalid base64")
		}
	}
	b, err := s.strVal(field)
	if b == nil || err != nil {
		return b, err
	}
	n, ok, _ := decodeBase64InPlace(b)
	if !ok {
		return nil, s.fieldErr(field, "invalid base64")
	}
	return b[:n:n], nil
}

// Decode parses a ResponseHeaders payload into m; headers as for
// RequestHeaders.Decode.
func (m *ResponseHeaders) Decode(payload []byte) error {
	m.Reset()
	m.raw = loadRaw(m.raw, payload)
	s := newScanner(m.raw)
	return s.document(func(key []byte) (err error) {
		switch string(key) {
		case "request_id":
			m.RequestID, _, err = s.u64("request_id", math.MaxUint64)
		case "timeout_ms":
			m.TimeoutMs, err = s.timeoutMs()
		case "status_code":
			var v int64
			v, _, err = s.i64("status_code", minInt32, maxInt32)
			m.StatusCode = int(v)
		case "headers":
			m.Headers, err = s.headers(m.Headers[:0], "headers", true)
		case "has_body":
			m.HasBody, err = s.boolVal("has_body")
		default:
			err = s.skip()
		}
		return err
	})
}

// Decode parses a BodyMutation payload into m. An absent phase is the zero
// Phase, request; data absent or null is a pass, "" a drop, bytes a
// replacement.
func (m *BodyMutation) Decode(payload []byte) error {
	m.Reset()
	m.raw = loadRaw(m.raw, payload)
	s := newScanner(m.raw)
	return s.document(s.bodyMutationFields(m))
}

// bodyMutationFields returns the member reader of a body mutation object
// (for document, members or nested). Decision uses it for its embedded
// mutations too, so that they share the Decision's buffer. It is inlined:
// the closure stays on the caller's stack.
func (s *scanner) bodyMutationFields(m *BodyMutation) func(key []byte) error {
	return func(key []byte) (err error) {
		switch string(key) {
		case "request_id":
			m.RequestID, _, err = s.u64("request_id", math.MaxUint64)
		case "phase":
			var p []byte
			if p, err = s.strVal("phase"); err == nil && p != nil {
				switch {
				case equalFold(p, "request"):
					m.Phase = PhaseRequest
				case equalFold(p, "response"):
					m.Phase = PhaseResponse
				default:
					err = s.fieldErr("phase", "unknown phase")
				}
			}
		case "chunk_index":
			var v uint64
			v, _, err = s.u64("chunk_index", math.MaxUint32)
			m.ChunkIndex = uint32(v)
		case "data":
			m.Action, m.Data = MutationPass, nil
			var d []byte
			if d, err = s.base64Val("data"); err == nil && d != nil {
				if len(d) == 0 {
					m.Action = MutationDrop
				} else {
					m.Action, m.Data = MutationReplace, d
				}
			}
		default:
			err = s.skip()
		}
		return err
	}
}

// Decode parses a Decision payload into m. See docs/protocol.md for the
// accepted shapes: kind names in any letter case, a verdict as a bare name
// or as an object with exactly one member kind → parameters, needs_more as
// the verdict or as a top-level flag, header operations in both shapes,
// embedded body mutations.
//
// Decode is syntactic: it keeps what the payload says and nothing more. A
// payload without a verdict (no "decision", null or {}) decodes with Kind
// DecisionUnset, an operation without one with Op HeaderOpUnset; a status
// that is absent or 0 stays 0; NeedsMore is the top-level flag as sent;
// an embedded mutation keeps the phase and request id it carries.
// Decision.Normalize applies the defaults and rules to that. An unknown
// kind and invalid verdict parameters wrap ErrProtocolDecision.
func (m *Decision) Decode(payload []byte) error {
	m.Reset()
	m.Kind = DecisionUnset
	m.raw = loadRaw(m.raw, payload)
	s := newScanner(m.raw)
	return s.document(func(key []byte) (err error) {
		switch string(key) {
		case "request_id":
			m.RequestID, _, err = s.u64("request_id", math.MaxUint64)
		case "decision":
			err = s.decision(m)
		case "needs_more":
			m.NeedsMore, err = s.boolVal("needs_more")
		case "request_headers":
			m.RequestHeaderOps, err = s.headerOps(m.RequestHeaderOps[:0], "request_headers")
		case "response_headers":
			m.ResponseHeaderOps, err = s.headerOps(m.ResponseHeaderOps[:0], "response_headers")
		case "request_body_mutation":
			m.HasRequestBodyMutation, err = s.embeddedMutation(&m.RequestBodyMutation, ctxRequestMutation, "request_body_mutation")
		case "response_body_mutation":
			m.HasResponseBodyMutation, err = s.embeddedMutation(&m.ResponseBodyMutation, ctxResponseMutation, "response_body_mutation")
		case "audit":
			err = s.audit(&m.Audit)
		case "cache":
			err = s.cacheDirective(&m.Cache)
		default:
			err = s.skip()
		}
		return err
	})
}

// cacheDirective reads "cache": "no_store", {"ttl_ms": N} or
// {"no_store": true}; null reads as absent.
func (s *scanner) cacheDirective(c *CacheDirective) error {
	*c = CacheDirective{}
	switch s.peek() {
	case '"':
		v, err := s.str()
		if err != nil {
			return err
		}
		if !equalFold(v, "no_store") {
			return s.fieldErr("cache", `expected "no_store" or an object`)
		}
		c.NoStore = true
		return nil
	case '{':
		_, err := s.nested("cache", ctxCache, func(key []byte) (err error) {
			switch string(key) {
			case "ttl_ms":
				var v uint64
				v, _, err = s.u64("ttl_ms", math.MaxUint32)
				c.TTLMs = uint32(v)
			case "no_store":
				c.NoStore, err = s.boolVal("no_store")
			default:
				err = s.skip()
			}
			return err
		})
		return err
	}
	if s.null() {
		return nil
	}
	return s.typeErr("cache", `"no_store" or an object`)
}

func (s *scanner) embeddedMutation(bm *BodyMutation, ctx errCtx, field string) (bool, error) {
	*bm = BodyMutation{}
	return s.nested(field, ctx, s.bodyMutationFields(bm))
}

// decisionKind matches a kind name in any letter case.
func decisionKind(name []byte) (DecisionKind, bool) {
	switch {
	case equalFold(name, "allow"):
		return DecisionAllow, true
	case equalFold(name, "block"):
		return DecisionBlock, true
	case equalFold(name, "redirect"):
		return DecisionRedirect, true
	case equalFold(name, "needs_more"), equalFold(name, "needsmore"):
		return DecisionNeedsMore, true
	}
	return 0, false
}

// decision reads the "decision" value: a kind name, or an object with
// exactly one member kind → parameters; null or {} name no verdict. A
// later "decision" replaces an earlier one.
func (s *scanner) decision(m *Decision) error {
	m.Kind, m.Status, m.Body, m.RedirectURL = DecisionUnset, 0, nil, nil
	m.BlockHeaders = m.BlockHeaders[:0]
	s.ctx = ctxDecision
	err := s.decisionValue(m)
	s.ctx = ctxTop
	return err
}

func (s *scanner) decisionValue(m *Decision) error {
	switch s.peek() {
	case '"':
		name, err := s.str()
		if err != nil {
			return err
		}
		kind, ok := decisionKind(name)
		if !ok {
			return s.fieldErr("kind", "unknown decision")
		}
		m.Kind = kind
		return nil
	case 'n':
		if s.null() {
			return nil
		}
	case '{':
		s.i++
		if err := s.enter(); err != nil {
			return err
		}
		n := 0
		return s.members(func(key []byte) (err error) {
			if n++; n > 1 {
				return s.fieldErr("kind", "more than one decision")
			}
			kind, ok := decisionKind(key)
			if !ok {
				return s.fieldErr("kind", "unknown decision")
			}
			m.Kind = kind
			switch kind {
			case DecisionAllow:
				err = s.skip() // {"allow":null} or {"allow":{}} (unit-like variants)
			case DecisionNeedsMore:
				err = s.needsMoreVerdict()
			case DecisionBlock:
				err = s.blockParams(m)
			case DecisionRedirect:
				err = s.redirectParams(m)
			}
			return err
		})
	}
	return s.typeErr("kind", "string or object")
}

// needsMoreVerdict reads the value of the needs_more verdict: true or an
// object ({"needs_more":false} says nothing and is not a verdict).
func (s *scanner) needsMoreVerdict() error {
	switch s.peek() {
	case 't', 'f':
		v, err := s.boolVal("needs_more")
		if err == nil && !v {
			err = s.fieldErr("needs_more", "false is not a decision")
		}
		return err
	case '{':
		return s.skip()
	}
	return s.typeErr("needs_more", "true")
}

// blockParams reads the parameters of a block; null reads as none.
func (s *scanner) blockParams(m *Decision) error {
	_, err := s.nested("block", ctxBlock, func(key []byte) (err error) {
		switch string(key) {
		case "status":
			err = s.status(&m.Status)
		case "body":
			m.Body, err = s.strVal("body")
		case "headers":
			m.BlockHeaders, err = s.headers(m.BlockHeaders[:0], "headers", false)
		default:
			err = s.skip()
		}
		return err
	})
	return err
}

// redirectParams reads the parameters of a redirect; null reads as none.
func (s *scanner) redirectParams(m *Decision) error {
	_, err := s.nested("redirect", ctxRedirect, func(key []byte) (err error) {
		switch string(key) {
		case "url":
			m.RedirectURL, err = s.strVal("url")
		case "status":
			err = s.status(&m.Status)
		default:
			err = s.skip()
		}
		return err
	})
	return err
}

// status reads a status into *st as sent, 0 (unset) included; null leaves
// *st as it is.
func (s *scanner) status(st *int) error {
	v, ok, err := s.i64("status", minInt32, maxInt32)
	if ok {
		*st = int(v)
	}
	return err
}

// headerOpKind matches an operation name in any letter case, with the
// synonyms some SDKs use.
func headerOpKind(name []byte) (HeaderOpKind, bool) {
	switch {
	case equalFold(name, "set"):
		return HeaderSet, true
	case equalFold(name, "add"), equalFold(name, "append"):
		return HeaderAdd, true
	case equalFold(name, "remove"), equalFold(name, "delete"):
		return HeaderRemove, true
	}
	return 0, false
}

// headerOps reads a list of header operations, each either
// {"operation":"set","name":..,"value":..} or {"set":{"name":..,"value":..}}.
// An operation without one (or with null) keeps Op HeaderOpUnset.
func (s *scanner) headerOps(ops []HeaderOp, field string) ([]HeaderOp, error) {
	if s.null() {
		return ops, nil
	}
	if err := s.array(field); err != nil {
		return ops, err
	}
	for n := 0; ; {
		more, err := s.elem(&n)
		if err != nil || !more {
			return ops, err
		}
		if err := s.object(field); err != nil {
			return ops, err
		}
		op := HeaderOp{Op: HeaderOpUnset}
		err = s.members(func(key []byte) (err error) {
			switch string(key) {
			case "operation", "op":
				var name []byte
				if name, err = s.strVal(field); err == nil && name != nil {
					var ok bool
					if op.Op, ok = headerOpKind(name); !ok {
						err = s.fieldErr(field, "unknown header operation")
					}
				}
			case "name":
				op.Name, err = s.strVal(field)
			case "value":
				op.Value, err = s.text(field)
			default:
				kind, ok := headerOpKind(key)
				if !ok || s.peek() != '{' {
					return s.skip()
				}
				op.Op = kind
				op.Name, op.Value, err = s.headerObject(field)
			}
			return err
		})
		if err != nil {
			return ops, err
		}
		if len(ops) >= MaxListEntries {
			return ops, s.tooMany(field)
		}
		ops = append(ops, op)
	}
}

// audit reads the audit record; custom is kept as raw JSON.
func (s *scanner) audit(a *Audit) error {
	tags, rules, codes := a.Tags[:0], a.RuleIDs[:0], a.ReasonCodes[:0]
	*a = Audit{Tags: tags, RuleIDs: rules, ReasonCodes: codes}
	_, err := s.nested("audit", ctxAudit, func(key []byte) (err error) {
		switch string(key) {
		case "tags":
			a.Tags, err = s.textList(a.Tags[:0], "tags")
		case "rule_ids":
			a.RuleIDs, err = s.textList(a.RuleIDs[:0], "rule_ids")
		case "reason_codes":
			a.ReasonCodes, err = s.textList(a.ReasonCodes[:0], "reason_codes")
		case "confidence":
			a.Confidence, a.HasConf, err = s.f64("confidence")
		case "custom":
			a.Custom = nil
			if !s.null() {
				start := s.i
				if err = s.skip(); err == nil {
					a.Custom = s.b[start:s.i:s.i]
				}
			}
		default:
			err = s.skip()
		}
		return err
	})
	return err
}

// textList reads an array of strings (numbers kept as text, nulls dropped).
func (s *scanner) textList(dst [][]byte, field string) ([][]byte, error) {
	if s.null() {
		return dst, nil
	}
	if err := s.array(field); err != nil {
		return dst, err
	}
	for n := 0; ; {
		more, err := s.elem(&n)
		if err != nil {
			return dst, err
		}
		if !more {
			return dst, nil
		}
		v, err := s.text(field)
		if err != nil {
			return dst, err
		}
		if v != nil {
			if len(dst) >= MaxListEntries {
				return dst, s.tooMany(field)
			}
			dst = append(dst, v)
		}
	}
}

// Decode parses a CancelRequest payload into m (reason may be absent).
func (m *CancelRequest) Decode(payload []byte) error {
	raw := loadRaw(m.raw, payload)
	*m = CancelRequest{raw: raw}
	s := newScanner(raw)
	return s.document(func(key []byte) (err error) {
		switch string(key) {
		case "request_id":
			m.RequestID, _, err = s.u64("request_id", math.MaxUint64)
		case "reason":
			m.Reason, err = s.strVal("reason")
		default:
			err = s.skip()
		}
		return err
	})
}

// Decode parses a CancelAll payload into m (reason may be absent).
func (m *CancelAll) Decode(payload []byte) error {
	raw := loadRaw(m.raw, payload)
	*m = CancelAll{raw: raw}
	s := newScanner(raw)
	return s.document(func(key []byte) (err error) {
		if string(key) == "reason" {
			m.Reason, err = s.strVal("reason")
			return err
		}
		return s.skip()
	})
}

// Decode parses a Ping (or Pong) payload into m. Ping has no byte fields, so
// the payload is read in place without being copied or modified.
func (m *Ping) Decode(payload []byte) error {
	*m = Ping{}
	var kb [128]byte
	s := newScanner(payload)
	if err := s.top(); err != nil {
		return err
	}
	for n := 0; ; {
		key, more, err := s.keyRO(&n, &kb)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		switch string(key) {
		case "sequence":
			m.Sequence, _, err = s.u64("sequence", math.MaxUint64)
		case "timestamp_ms":
			m.TimestampMs, _, err = s.i64("timestamp_ms", math.MinInt64, math.MaxInt64)
		default:
			err = s.skip()
		}
		if err != nil {
			return err
		}
	}
	return s.end()
}

// PeekRequestID returns the top-level "request_id" of a payload without
// decoding it: it reads members only up to that key, skipping the values
// before it, and neither copies nor modifies the payload. It reports false
// when the payload is not an object, the key is absent or null, its value
// is not a u64, or the payload is malformed before the key. It does not
// validate the rest of the payload.
func PeekRequestID(payload []byte) (uint64, bool) {
	// Fast path: every encoder here writes request_id first.
	const prefix = `{"request_id":`
	if bytes.HasPrefix(payload, []byte(prefix)) {
		var v uint64
		i := len(prefix)
		for ; i < len(payload) && payload[i] >= '0' && payload[i] <= '9' && i-len(prefix) < 19; i++ {
			v = v*10 + uint64(payload[i]-'0')
		}
		if i < len(payload) && i > len(prefix) && (payload[i] == ',' || payload[i] == '}') &&
			(payload[len(prefix)] != '0' || i == len(prefix)+1) {
			return v, true
		}
	}
	var kb [128]byte
	s := newScanner(payload)
	if s.top() != nil {
		return 0, false
	}
	for n := 0; ; {
		key, more, err := s.keyRO(&n, &kb)
		if err != nil || !more {
			return 0, false
		}
		if string(key) == "request_id" {
			v, ok, err := s.u64("request_id", math.MaxUint64)
			if err != nil || !ok {
				return 0, false
			}
			// The number must end where JSON allows.
			if c := s.peek(); c != ',' && c != '}' {
				return 0, false
			}
			return v, true
		}
		if s.skip() != nil {
			return 0, false
		}
	}
}
