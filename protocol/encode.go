package protocol

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"unicode/utf8"
)

// Encoders append one JSON payload (no frame header) to dst and return the
// extended slice; with a dst of sufficient capacity they do not allocate.
// Output is strict: the field order and shapes of docs/protocol.md section 4 (Messages),
// snake_case keys, optional fields omitted when empty, strings escaped with
// invalid UTF-8 replaced by \ufffd (as encoding/json does).

// AppendRequestHeaders appends the RequestHeaders (0x10) payload of m.
// Headers are grouped into the name → [values] object form in order of
// first appearance (equal names need not be adjacent; names are compared
// exactly, so pass them lower-case). metadata is always written, with its
// empty fields omitted (client_port and server_port when not in
// 1..65535); timeout_ms only when not 0, request_target when not empty.
func AppendRequestHeaders(dst []byte, m *RequestHeaders) []byte {
	dst = append(dst, `{"request_id":`...)
	dst = strconv.AppendUint(dst, m.RequestID, 10)
	dst = appendTimeout(dst, m.TimeoutMs)
	dst = append(dst, `,"method":`...)
	dst = appendString(dst, m.Method)
	dst = append(dst, `,"uri":`...)
	dst = appendString(dst, m.URI)
	if len(m.RequestTarget) > 0 {
		dst = append(dst, `,"request_target":`...)
		dst = appendString(dst, m.RequestTarget)
	}
	dst = append(dst, `,"has_body":`...)
	dst = strconv.AppendBool(dst, m.HasBody)
	dst = append(dst, `,"headers":`...)
	dst = appendHeaders(dst, m.Headers)
	dst = append(dst, `,"metadata":`...)
	dst = appendMetadata(dst, &m.Metadata)
	if m.HasInlineBody {
		dst = appendInlineBody(dst, &m.InlineBody)
	}
	return append(dst, '}')
}

func appendMetadata(dst []byte, md *Metadata) []byte {
	dst = append(dst, '{')
	n := len(dst)
	dst = appendOptString(dst, n, `"correlation_id":`, md.CorrelationID)
	dst = appendOptString(dst, n, `"client_ip":`, md.ClientIP)
	if md.ClientPort > 0 && md.ClientPort <= 65535 {
		if len(dst) > n {
			dst = append(dst, ',')
		}
		dst = append(dst, `"client_port":`...)
		dst = strconv.AppendInt(dst, int64(md.ClientPort), 10)
	}
	dst = appendOptString(dst, n, `"protocol":`, md.Protocol)
	dst = appendOptString(dst, n, `"server_name":`, md.ServerName)
	dst = appendOptString(dst, n, `"route_id":`, md.RouteID)
	dst = appendOptString(dst, n, `"upstream_id":`, md.UpstreamID)
	dst = appendOptString(dst, n, `"traceparent":`, md.Traceparent)
	dst = appendOptString(dst, n, `"timestamp":`, md.Timestamp)
	dst = appendOptString(dst, n, `"tls_version":`, md.TLSVersion)
	dst = appendOptString(dst, n, `"tls_cipher":`, md.TLSCipher)
	dst = appendOptString(dst, n, `"tls_server_name":`, md.TLSServerName)
	dst = appendOptString(dst, n, `"tls_client_subject":`, md.TLSClientSubject)
	dst = appendOptString(dst, n, `"tls_client_san":`, md.TLSClientSAN)
	dst = appendOptString(dst, n, `"server_ip":`, md.ServerIP)
	if md.ServerPort > 0 && md.ServerPort <= 65535 {
		if len(dst) > n {
			dst = append(dst, ',')
		}
		dst = append(dst, `"server_port":`...)
		dst = strconv.AppendInt(dst, int64(md.ServerPort), 10)
	}
	dst = appendOptString(dst, n, `"listener_id":`, md.ListenerID)
	dst = appendOptString(dst, n, `"upstream_host":`, md.UpstreamHost)
	dst = appendOptString(dst, n, `"forwarded_for":`, md.ForwardedFor)
	dst = appendOptString(dst, n, `"forwarded_proto":`, md.ForwardedProto)
	dst = appendOptString(dst, n, `"forwarded_host":`, md.ForwardedHost)
	dst = appendOptString(dst, n, `"path":`, md.Path)
	return append(dst, '}')
}

// appendTimeout writes `,"timeout_ms":N` unless ms is 0 (unknown). It
// follows request_id in every event, so that it is written in one place
// of each and never inside an inline body.
func appendTimeout(dst []byte, ms uint32) []byte {
	if ms == 0 {
		return dst
	}
	dst = append(dst, `,"timeout_ms":`...)
	return strconv.AppendUint(dst, uint64(ms), 10)
}

// appendOptString writes key and v unless v is empty, with a comma when the
// object (whose content starts at dst[n]) already has a member.
func appendOptString(dst []byte, n int, key string, v []byte) []byte {
	if len(v) == 0 {
		return dst
	}
	if len(dst) > n {
		dst = append(dst, ',')
	}
	dst = append(dst, key...)
	return appendString(dst, v)
}

// Header grouping: a direct scan is quadratic but cheapest for the usual
// few fields; longer lists (a hostile client can send hundreds) are linked
// through a hash table, on the stack up to groupStack fields.
const (
	groupDirect = 16
	groupStack  = 128
)

var groupSeed = maphash.MakeSeed()

// appendHeaders writes {"name":["v1","v2"],...}, grouping equal names in
// order of first appearance.
func appendHeaders(dst []byte, h Headers) []byte {
	if len(h) > groupDirect {
		return appendHeadersHashed(dst, h, false)
	}
	dst = append(dst, '{')
	first := true
	for i := range h {
		name := h[i].Name
		if seenBefore(h[:i], name) {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendString(dst, name)
		dst = append(dst, `:[`...)
		dst = appendString(dst, h[i].Value)
		for j := i + 1; j < len(h); j++ {
			if sameName(h[j].Name, name) {
				dst = append(dst, ',')
				dst = appendString(dst, h[j].Value)
			}
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

// appendHeaderMap writes {"name":"value",...}: one value per name, the last
// one when a name repeats, at the position of its first appearance.
func appendHeaderMap(dst []byte, h Headers) []byte {
	if len(h) > groupDirect {
		return appendHeadersHashed(dst, h, true)
	}
	dst = append(dst, '{')
	first := true
	for i := range h {
		name := h[i].Name
		if seenBefore(h[:i], name) {
			continue
		}
		last := i
		for j := i + 1; j < len(h); j++ {
			if sameName(h[j].Name, name) {
				last = j
			}
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendString(dst, name)
		dst = append(dst, ':')
		dst = appendString(dst, h[last].Value)
	}
	return append(dst, '}')
}

// appendHeadersHashed is appendHeaders (or, with last, appendHeaderMap) in
// linear time: each field is linked to the next one of the same name, and
// each name's first field records its group's last one.
func appendHeadersHashed(dst []byte, h Headers, last bool) []byte {
	var nextArr, tailArr [groupStack]uint32
	var tableArr [2 * groupStack]uint32
	n := len(h)
	// Entries are field index + 1; 0 is "none".
	next, tail, table := nextArr[:], tailArr[:], tableArr[:]
	if n > groupStack {
		size := 2 * groupStack
		for size < 2*n {
			size <<= 1
		}
		next, tail, table = make([]uint32, n), make([]uint32, n), make([]uint32, size)
	}
	mask := uint64(len(table) - 1)
	for i := range h {
		name := h[i].Name
		for p := maphash.Bytes(groupSeed, name) & mask; ; p = (p + 1) & mask {
			e := table[p]
			if e == 0 {
				table[p] = uint32(i) + 1
				tail[i] = uint32(i) + 1 // i leads its name's group
				break
			}
			if lead := e - 1; sameName(h[lead].Name, name) {
				next[tail[lead]-1] = uint32(i) + 1
				tail[lead] = uint32(i) + 1
				break
			}
		}
	}
	dst = append(dst, '{')
	first := true
	for i := range h {
		if tail[i] == 0 {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = appendString(dst, h[i].Name)
		if last {
			dst = append(dst, ':')
			dst = appendString(dst, h[tail[i]-1].Value)
			continue
		}
		dst = append(dst, `:[`...)
		for j := uint32(i) + 1; j != 0; j = next[j-1] {
			if j != uint32(i)+1 {
				dst = append(dst, ',')
			}
			dst = appendString(dst, h[j-1].Value)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}

func sameName(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || a[0] == b[0]) && bytes.Equal(a, b)
}

func seenBefore(h Headers, name []byte) bool {
	for k := range h {
		if sameName(h[k].Name, name) {
			return true
		}
	}
	return false
}

// AppendBodyChunk appends a body chunk payload. t selects the progress key:
// TypeRequestBodyChunk writes "bytes_received", TypeResponseBodyChunk
// "bytes_sent". total_size and the progress field are omitted when negative
// (unknown), timeout_ms when 0.
func AppendBodyChunk(dst []byte, m *BodyChunk, t MsgType) []byte {
	dst = slices.Grow(dst, 128+base64.StdEncoding.EncodedLen(len(m.Data)))
	dst = append(dst, `{"request_id":`...)
	dst = strconv.AppendUint(dst, m.RequestID, 10)
	dst = appendTimeout(dst, m.TimeoutMs)
	dst = append(dst, ',')
	return appendChunkFields(dst, m, t)
}

// appendChunkFields writes the members of a body chunk after request_id
// (chunk_index, data, is_last, then total_size and the progress key of t
// when known) and closes the object. A chunk inlined in RequestHeaders is
// the same object without request_id.
func appendChunkFields(dst []byte, m *BodyChunk, t MsgType) []byte {
	dst = append(dst, `"chunk_index":`...)
	dst = strconv.AppendUint(dst, uint64(m.ChunkIndex), 10)
	dst = append(dst, `,"data":"`...)
	dst = base64.StdEncoding.AppendEncode(dst, m.Data)
	dst = append(dst, `","is_last":`...)
	dst = strconv.AppendBool(dst, m.IsLast)
	if m.TotalSize >= 0 {
		dst = append(dst, `,"total_size":`...)
		dst = strconv.AppendInt(dst, m.TotalSize, 10)
	}
	if m.Progress >= 0 {
		if t == TypeResponseBodyChunk {
			dst = append(dst, `,"bytes_sent":`...)
		} else {
			dst = append(dst, `,"bytes_received":`...)
		}
		dst = strconv.AppendInt(dst, m.Progress, 10)
	}
	return append(dst, '}')
}

// AppendResponseHeaders appends the ResponseHeaders (0x12) payload of m;
// headers are grouped as in AppendRequestHeaders.
func AppendResponseHeaders(dst []byte, m *ResponseHeaders) []byte {
	dst = append(dst, `{"request_id":`...)
	dst = strconv.AppendUint(dst, m.RequestID, 10)
	dst = appendTimeout(dst, m.TimeoutMs)
	dst = append(dst, `,"status_code":`...)
	dst = strconv.AppendInt(dst, int64(m.StatusCode), 10)
	dst = append(dst, `,"headers":`...)
	dst = appendHeaders(dst, m.Headers)
	dst = append(dst, `,"has_body":`...)
	dst = strconv.AppendBool(dst, m.HasBody)
	return append(dst, '}')
}

// AppendDecision appends the Decision (0x20) payload of m. request_headers
// and response_headers are always written (possibly []), the top-level
// needs_more only when set, the embedded body mutations when their Has flag
// is set, and audit only when not empty. A block or redirect with Status 0
// is written with the default status (403, 302). A Kind outside the known
// values is written as "unknown", which every receiver rejects.
func AppendDecision(dst []byte, m *Decision) []byte {
	dst = append(dst, `{"request_id":`...)
	dst = strconv.AppendUint(dst, m.RequestID, 10)
	dst = append(dst, `,"decision":`...)
	switch m.Kind {
	case DecisionAllow:
		dst = append(dst, `"allow"`...)
	case DecisionBlock:
		dst = append(dst, `{"block":{"status":`...)
		dst = strconv.AppendInt(dst, int64(statusOr(m.Status, defaultBlockStatus)), 10)
		dst = append(dst, `,"body":`...)
		if m.Body == nil {
			dst = append(dst, `null`...)
		} else {
			dst = appendString(dst, m.Body)
		}
		dst = append(dst, `,"headers":`...)
		dst = appendHeaderMap(dst, m.BlockHeaders)
		dst = append(dst, `}}`...)
	case DecisionRedirect:
		dst = append(dst, `{"redirect":{"url":`...)
		dst = appendString(dst, m.RedirectURL)
		dst = append(dst, `,"status":`...)
		dst = strconv.AppendInt(dst, int64(statusOr(m.Status, defaultRedirectStatus)), 10)
		dst = append(dst, `}}`...)
	case DecisionNeedsMore:
		dst = append(dst, `{"needs_more":true}`...)
	default:
		dst = append(dst, `"unknown"`...)
	}
	dst = append(dst, `,"request_headers":`...)
	dst = appendHeaderOps(dst, m.RequestHeaderOps)
	dst = append(dst, `,"response_headers":`...)
	dst = appendHeaderOps(dst, m.ResponseHeaderOps)
	if m.HasRequestBodyMutation {
		dst = append(dst, `,"request_body_mutation":`...)
		dst = AppendBodyMutation(dst, &m.RequestBodyMutation)
	}
	if m.HasResponseBodyMutation {
		dst = append(dst, `,"response_body_mutation":`...)
		dst = AppendBodyMutation(dst, &m.ResponseBodyMutation)
	}
	if m.NeedsMore {
		dst = append(dst, `,"needs_more":true`...)
	}
	if !m.Audit.Empty() {
		dst = append(dst, `,"audit":`...)
		dst = appendAudit(dst, &m.Audit)
	}
	switch {
	case m.Cache.NoStore:
		dst = append(dst, `,"cache":"no_store"`...)
	case m.Cache.TTLMs > 0:
		dst = append(dst, `,"cache":{"ttl_ms":`...)
		dst = strconv.AppendUint(dst, uint64(m.Cache.TTLMs), 10)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

func statusOr(status, def int) int {
	if status == 0 {
		return def
	}
	return status
}

// appendHeaderOps writes [{"operation":"set","name":..,"value":..},...];
// remove has no value.
func appendHeaderOps(dst []byte, ops []HeaderOp) []byte {
	dst = append(dst, '[')
	for i := range ops {
		op := &ops[i]
		if i > 0 {
			dst = append(dst, ',')
		}
		switch op.Op {
		case HeaderAdd:
			dst = append(dst, `{"operation":"add","name":`...)
		case HeaderRemove:
			dst = append(dst, `{"operation":"remove","name":`...)
		default:
			dst = append(dst, `{"operation":"set","name":`...)
		}
		dst = appendString(dst, op.Name)
		if op.Op != HeaderRemove {
			dst = append(dst, `,"value":`...)
			dst = appendString(dst, op.Value)
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// appendAudit writes the audit record: the three lists always, confidence
// when set and finite, custom when set and valid JSON (it is raw JSON
// supplied by the caller; an invalid one is dropped rather than corrupting
// the payload).
func appendAudit(dst []byte, a *Audit) []byte {
	dst = append(dst, `{"tags":`...)
	dst = appendStringList(dst, a.Tags)
	dst = append(dst, `,"rule_ids":`...)
	dst = appendStringList(dst, a.RuleIDs)
	if a.HasConf && !math.IsNaN(a.Confidence) && !math.IsInf(a.Confidence, 0) {
		dst = append(dst, `,"confidence":`...)
		dst = strconv.AppendFloat(dst, a.Confidence, 'g', -1, 64)
	}
	dst = append(dst, `,"reason_codes":`...)
	dst = appendStringList(dst, a.ReasonCodes)
	if len(a.Custom) > 0 && validJSON(a.Custom) {
		dst = append(dst, `,"custom":`...)
		dst = append(dst, a.Custom...)
	}
	return append(dst, '}')
}

func appendStringList(dst []byte, l [][]byte) []byte {
	dst = append(dst, '[')
	for i, v := range l {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, v)
	}
	return append(dst, ']')
}

// AppendBodyMutation appends the BodyMutation (0x21) payload of m. data is
// omitted for MutationPass, "" for MutationDrop and base64 for
// MutationReplace (a replacement with no bytes is therefore a drop).
func AppendBodyMutation(dst []byte, m *BodyMutation) []byte {
	if m.Action == MutationReplace {
		dst = slices.Grow(dst, 96+base64.StdEncoding.EncodedLen(len(m.Data)))
	}
	dst = append(dst, `{"request_id":`...)
	dst = strconv.AppendUint(dst, m.RequestID, 10)
	if m.Phase == PhaseResponse {
		dst = append(dst, `,"phase":"response"`...)
	} else {
		dst = append(dst, `,"phase":"request"`...)
	}
	dst = append(dst, `,"chunk_index":`...)
	dst = strconv.AppendUint(dst, uint64(m.ChunkIndex), 10)
	switch m.Action {
	case MutationDrop:
		dst = append(dst, `,"data":""`...)
	case MutationReplace:
		dst = append(dst, `,"data":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, m.Data)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// AppendCancelRequest appends the CancelRequest (0x30) payload of m; reason
// is omitted when empty.
func AppendCancelRequest(dst []byte, m *CancelRequest) []byte {
	dst = append(dst, `{"request_id":`...)
	dst = strconv.AppendUint(dst, m.RequestID, 10)
	if len(m.Reason) > 0 {
		dst = append(dst, `,"reason":`...)
		dst = appendString(dst, m.Reason)
	}
	return append(dst, '}')
}

// AppendCancelAll appends the CancelAll (0x31) payload of m; reason is
// omitted when empty.
func AppendCancelAll(dst []byte, m *CancelAll) []byte {
	dst = append(dst, '{')
	if len(m.Reason) > 0 {
		dst = append(dst, `"reason":`...)
		dst = appendString(dst, m.Reason)
	}
	return append(dst, '}')
}

// AppendPing appends a Ping (0xF0) or Pong (0xF1) payload.
func AppendPing(dst []byte, m *Ping) []byte {
	dst = append(dst, `{"sequence":`...)
	dst = strconv.AppendUint(dst, m.Sequence, 10)
	dst = append(dst, `,"timestamp_ms":`...)
	dst = strconv.AppendInt(dst, m.TimestampMs, 10)
	return append(dst, '}')
}

// safeASCII marks the ASCII bytes written unescaped inside a JSON string.
var safeASCII = func() (t [utf8.RuneSelf]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

const hexDigits = "0123456789abcdef"

// appendString writes s as a JSON string. Runs of plain ASCII are copied
// eight bytes at a time; control characters, quote and backslash are
// escaped; each byte of invalid UTF-8 becomes \ufffd.
func appendString(dst, s []byte) []byte {
	dst = append(dst, '"')
	start, i := 0, 0
	for i < len(s) {
		for i+8 <= len(s) {
			if m := specialInString(binary.LittleEndian.Uint64(s[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if c < utf8.RuneSelf {
			if safeASCII[c] {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
