package protocol

import "fmt"

// One schema for every transport.
//
// The wire codecs — the JSON codec of this package (UDS and reverse
// connections) and the protobuf codec of the gRPC transport — are purely
// syntactic: they decode what a payload holds and report malformed input
// (bad syntax, a value of the wrong type or out of its type's range, an
// enum name or number the type does not know, a JSON shape the schema does
// not have), and nothing more. They apply no default and no rule that
// relates one field to another.
//
// Those rules are the schema, and Decision.Normalize is the single place
// for them. Every read path of the proxy runs it once on each decoded
// Decision before the decision is used (agentmux.Session.Deliver does it
// for every transport), so the same reply means the same thing whichever
// transport carried it.
//
// What the proxy then allows — the statuses it answers with, safe redirect
// targets, which headers an agent may touch and how many — is the
// dataplane's policy, not schema, and stays in the dataplane.

// Markers a decoder leaves for what the payload did not say, so that
// Normalize, not the decoder, decides what that means. Both are rejected by
// Normalize; neither is ever sent.
const (
	// DecisionUnset is the Kind of a decoded Decision that names no
	// verdict: no "decision" key, or null or {} in JSON; no member of the
	// verdict oneof in protobuf.
	DecisionUnset DecisionKind = 0xFF
	// HeaderOpUnset is the Op of a decoded header operation that names no
	// operation: no "operation" (or "op") in JSON, OPERATION_UNSPECIFIED
	// in protobuf.
	HeaderOpUnset HeaderOpKind = 0xFF
)

// The statuses of a block and a redirect whose status is 0 (unset).
const (
	defaultBlockStatus    = 403
	defaultRedirectStatus = 302
)

// The errors of Normalize are built once: a reply that breaks the schema
// costs no allocation either.
var (
	errNoVerdict       = fmt.Errorf("%w: no verdict", ErrProtocolDecision)
	errUnknownKind     = fmt.Errorf("%w: unknown decision kind", ErrProtocolDecision)
	errRedirectNoURL   = fmt.Errorf("%w: redirect without url", ErrProtocolDecision)
	errRequestOpsNoOp  = fmt.Errorf("%w: request_headers: missing header operation", ErrProtocolField)
	errRequestOpsKind  = fmt.Errorf("%w: request_headers: unknown header operation", ErrProtocolField)
	errRequestOpsName  = fmt.Errorf("%w: request_headers: header operation without a name", ErrProtocolField)
	errResponseOpsNoOp = fmt.Errorf("%w: response_headers: missing header operation", ErrProtocolField)
	errResponseOpsKind = fmt.Errorf("%w: response_headers: unknown header operation", ErrProtocolField)
	errResponseOpsName = fmt.Errorf("%w: response_headers: header operation without a name", ErrProtocolField)
)

// Normalize applies the schema of agent protocol v2 to a decoded Decision,
// in place. It is the one place for these rules (see the top of this
// file); the codecs leave them out, and code that uses a normalized
// Decision does not apply them again.
//
//   - A verdict is required: DecisionUnset (or a kind outside the known
//     ones) is an error wrapping ErrProtocolDecision.
//   - Block: status 0 means 403. Redirect: status 0
//     means 302, and a non-empty URL is required
//     (ErrProtocolDecision).
//   - needs_more: the needs_more verdict always sets NeedsMore; the
//     top-level flag counts only with allow — a block or a redirect is
//     final, so NeedsMore is cleared for them.
//   - Header operations: an operation and a non-empty name are required
//     (ErrProtocolField); a remove carries no value (Value is cleared).
//   - A body mutation embedded in the Decision belongs to it: its phase is
//     the one of the key it came in (request_body_mutation or
//     response_body_mutation) and its RequestID is the Decision's.
//   - cache: no_store wins over a TTL (TTLMs is cleared).
//
// Normalize does not allocate and is idempotent. On error d is partly
// normalized and must not be used; the error fails the reply's request
// only (the proxy reports it as a protocol error).
func (d *Decision) Normalize() error {
	switch d.Kind {
	case DecisionAllow:
	case DecisionNeedsMore:
		d.NeedsMore = true
	case DecisionBlock:
		d.NeedsMore = false
		if d.Status == 0 {
			d.Status = defaultBlockStatus
		}
	case DecisionRedirect:
		d.NeedsMore = false
		if d.Status == 0 {
			d.Status = defaultRedirectStatus
		}
		if len(d.RedirectURL) == 0 {
			return errRedirectNoURL
		}
	case DecisionUnset:
		return errNoVerdict
	default:
		return errUnknownKind
	}
	if err := normalizeOps(d.RequestHeaderOps, errRequestOpsNoOp, errRequestOpsKind, errRequestOpsName); err != nil {
		return err
	}
	if err := normalizeOps(d.ResponseHeaderOps, errResponseOpsNoOp, errResponseOpsKind, errResponseOpsName); err != nil {
		return err
	}
	if d.Cache.NoStore {
		d.Cache.TTLMs = 0
	}
	if d.HasRequestBodyMutation {
		d.RequestBodyMutation.RequestID, d.RequestBodyMutation.Phase = d.RequestID, PhaseRequest
	}
	if d.HasResponseBodyMutation {
		d.ResponseBodyMutation.RequestID, d.ResponseBodyMutation.Phase = d.RequestID, PhaseResponse
	}
	return nil
}

func normalizeOps(ops []HeaderOp, errNoOp, errKind, errName error) error {
	for i := range ops {
		op := &ops[i]
		switch op.Op {
		case HeaderSet, HeaderAdd:
		case HeaderRemove:
			op.Value = nil
		case HeaderOpUnset:
			return errNoOp
		default:
			return errKind
		}
		if len(op.Name) == 0 {
			return errName
		}
	}
	return nil
}
