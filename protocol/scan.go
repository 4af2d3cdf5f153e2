package protocol

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// maxDepth bounds JSON nesting (the top-level object counts as 1) so that a
// hostile payload cannot exhaust the stack of the recursive value skipper.
const maxDepth = 64

// SWAR constants: eight bytes are tested at once on the hot string paths.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// hasZero reports (in the high bits) whether any byte of x is zero.
func hasZero(x uint64) uint64 { return (x - lsb) & ^x & msb }

// hasLess reports whether any byte of x is below n (exact for n <= 128).
func hasLess(x uint64, n uint64) uint64 { return (x - lsb*n) & ^x & msb }

// specialInString flags the bytes that end the fast path inside a JSON string:
// quote, backslash, control characters and non-ASCII (checked as UTF-8).
func specialInString(w uint64) uint64 {
	return hasLess(w, 0x20) | hasZero(w^(lsb*'"')) | hasZero(w^(lsb*'\\')) | (w & msb)
}

// scanner is a small JSON reader over one buffer. str and key unescape
// strings in place (the unescaped form is never longer than the escaped
// one), so the strings they return are sub-slices of b; they are used only
// on a buffer the decoder owns. skip and keyRO never write to b: they are
// what read-only users (validation, Ping, PeekRequestID) call.
type scanner struct {
	b     []byte
	i     int
	depth int
	// ctx says where the scanner is, for error messages and for the
	// sentinel wrapped by type and value errors. It is an index rather than
	// a string or error value because anything the error path reads through
	// s is, to escape analysis, as escaping as s.b itself: a pointer there
	// would move the read-only callers' buffers to the heap.
	ctx errCtx
}

func newScanner(b []byte) scanner { return scanner{b: b} }

type errCtx uint8

const (
	ctxTop errCtx = iota
	ctxMetadata
	ctxDecision // from here on, value errors wrap ErrProtocolDecision
	ctxBlock
	ctxRedirect
	ctxAudit // and from here on, ErrProtocolField again
	ctxRequestMutation
	ctxResponseMutation
	ctxInlineBody
	ctxCache
)

var ctxNames = [...]string{"", "metadata.", "decision.", "decision.block.", "decision.redirect.", "audit.", "request_body_mutation.", "response_body_mutation.", "inline_body.", "cache."}

// Errors are the cold path: fmt is fine here. They name the field and the
// offset, never the payload's content.

func (s *scanner) synErr(what string) error {
	return fmt.Errorf("%w: %s at offset %d", ErrProtocolSyntax, what, s.i)
}

// tooMany is the error of a list longer than MaxListEntries.
func (s *scanner) tooMany(field string) error {
	return s.fieldErr(field, fmt.Sprintf("more than %d entries", MaxListEntries))
}

func (s *scanner) fieldErr(field, what string) error {
	sentinel := ErrProtocolField
	if s.ctx >= ctxDecision && s.ctx < ctxAudit {
		sentinel = ErrProtocolDecision
	}
	return fmt.Errorf("%w: %s%s: %s", sentinel, ctxNames[s.ctx], field, what)
}

// typeErr reports a value of the wrong JSON type, or the syntax error when
// what follows is not a well-formed JSON value: a truncated or garbled
// payload is a syntax error, whatever field it was cut in.
func (s *scanner) typeErr(field, want string) error {
	if err := s.skip(); err != nil {
		return err
	}
	return s.fieldErr(field, "expected "+want)
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// peek skips whitespace and returns the next byte, 0 at the end. Compact
// JSON (what every encoder sends) takes the first branch.
func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		if c := s.b[s.i]; c > ' ' {
			return c
		}
		s.ws()
		if s.i < len(s.b) {
			return s.b[s.i]
		}
	}
	return 0
}

// null consumes a null literal if one comes next.
func (s *scanner) null() bool {
	if s.peek() == 'n' && len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "null" {
		s.i += 4
		return true
	}
	return false
}

// top opens the payload's top-level object.
func (s *scanner) top() error {
	if s.peek() != '{' {
		return fmt.Errorf("%w: payload is not a JSON object", ErrProtocolSyntax)
	}
	s.i++
	s.depth = 1
	return nil
}

// end checks that nothing but whitespace follows the top-level object.
func (s *scanner) end() error {
	s.ws()
	if s.i != len(s.b) {
		return s.synErr("data after the JSON object")
	}
	return nil
}

// object opens a nested object; null is the caller's business.
func (s *scanner) object(field string) error {
	if s.peek() != '{' {
		return s.typeErr(field, "object")
	}
	s.i++
	return s.enter()
}

func (s *scanner) array(field string) error {
	if s.peek() != '[' {
		return s.typeErr(field, "array")
	}
	s.i++
	return s.enter()
}

func (s *scanner) enter() error {
	s.depth++
	if s.depth > maxDepth {
		return s.synErr("nesting too deep")
	}
	return nil
}

// key advances to the next member of the current object and returns its
// key (unescaped in place); more is false (and the '}' consumed) at the end.
// n counts members.
func (s *scanner) key(n *int) (key []byte, more bool, err error) {
	if more, err = s.member(n); !more || err != nil {
		return nil, more, err
	}
	if key, err = s.str(); err != nil {
		return nil, false, err
	}
	return key, true, s.colon()
}

// document reads a whole payload: the top-level object, each of its
// members through field, and nothing but whitespace after it.
func (s *scanner) document(field func(key []byte) error) error {
	if err := s.top(); err != nil {
		return err
	}
	if err := s.members(field); err != nil {
		return err
	}
	return s.end()
}

// members reads the members of the object just opened, up to and including
// its '}'. field gets each key (unescaped in place) and must consume the
// member's value; its first error ends the object. The func value does not
// escape, so a closure passed here stays on the caller's stack.
func (s *scanner) members(field func(key []byte) error) error {
	for n := 0; ; {
		key, more, err := s.key(&n)
		if err != nil || !more {
			return err
		}
		if err := field(key); err != nil {
			return err
		}
	}
}

// nested reads the value of field, an object whose members go through fn
// as for members; null reads as absent (present is false). Errors inside
// name ctx; the scanner's context is restored after it.
func (s *scanner) nested(field string, ctx errCtx, fn func(key []byte) error) (present bool, err error) {
	if s.null() {
		return false, nil
	}
	if err := s.object(field); err != nil {
		return false, err
	}
	outer := s.ctx
	s.ctx = ctx
	err = s.members(fn)
	s.ctx = outer
	return err == nil, err
}

// keyRO is key for a buffer that must not be written: a key with escapes is
// unescaped into buf instead (a key too long for buf cannot be one we look
// for, and reads as ""). buf is a parameter, not a scanner field, so that
// the caller's array can stay on its stack.
func (s *scanner) keyRO(n *int, buf *[128]byte) (key []byte, more bool, err error) {
	if more, err = s.member(n); !more || err != nil {
		return nil, more, err
	}
	start, end, esc, err := s.span()
	if err != nil {
		return nil, false, err
	}
	key = s.b[start:end:end]
	if esc {
		src := s.b[start:end]
		if len(src) > len(buf) {
			_, ok := unescape(nil, src)
			key = nil
			if !ok {
				return nil, false, s.synErr("invalid escape in string")
			}
		} else {
			k, ok := unescape(buf[:len(src)], src)
			if !ok {
				return nil, false, s.synErr("invalid escape in string")
			}
			key = buf[:k:k]
		}
	}
	return key, true, s.colon()
}

// member steps to the next member of an object, up to its key's opening
// quote; more is false (and the '}' consumed) at the end.
func (s *scanner) member(n *int) (more bool, err error) {
	c := s.peek()
	if c == '}' {
		s.i++
		s.depth--
		return false, nil
	}
	if *n > 0 {
		if c != ',' {
			return false, s.synErr("expected ',' or '}'")
		}
		s.i++
		c = s.peek()
	}
	*n++
	if c != '"' {
		return false, s.synErr("expected object key")
	}
	return true, nil
}

func (s *scanner) colon() error {
	if s.peek() != ':' {
		return s.synErr("expected ':'")
	}
	s.i++
	return nil
}

// elem advances to the next element of the current array; more is false
// (and the ']' consumed) at the end.
func (s *scanner) elem(n *int) (more bool, err error) {
	c := s.peek()
	if c == ']' {
		s.i++
		s.depth--
		return false, nil
	}
	if *n > 0 {
		if c != ',' {
			return false, s.synErr("expected ',' or ']'")
		}
		s.i++
		if s.peek() == ']' {
			return false, s.synErr("trailing comma")
		}
	}
	*n++
	return true, nil
}

// span finds the end of the string whose opening quote is at s.i, checking
// for control characters and invalid UTF-8; it reports whether escapes occur.
// On success s.i is past the closing quote and [start,end) is the content.
func (s *scanner) span() (start, end int, esc bool, err error) {
	b := s.b
	i := s.i + 1
	start = i
	for {
		// Skip eight plain bytes at a time; the lowest flagged byte of the
		// SWAR mask is exactly the first special one (no false positives
		// below a true hit), so jump straight to it.
		for i+8 <= len(b) {
			if m := specialInString(binary.LittleEndian.Uint64(b[i:])); m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				break
			}
			i += 8
		}
		if i >= len(b) {
			s.i = len(b)
			return 0, 0, false, s.synErr("unterminated string")
		}
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return start, i, esc, nil
		case c == '\\':
			esc = true
			i += 2
		case c < 0x20:
			s.i = i
			return 0, 0, false, s.synErr("control character in string")
		case c < utf8.RuneSelf:
			i++
		default:
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				s.i = i
				return 0, 0, false, s.synErr("invalid UTF-8")
			}
			i += size
		}
	}
}

// str reads a string and returns its unescaped content as a capped
// sub-slice of the buffer (unescaping in place).
func (s *scanner) str() ([]byte, error) {
	start, end, esc, err := s.span()
	if err != nil {
		return nil, err
	}
	if !esc {
		return s.b[start:end:end], nil
	}
	n, ok := unescape(s.b[start:end], s.b[start:end])
	if !ok {
		return nil, s.synErr("invalid escape in string")
	}
	return s.b[start : start+n : start+n], nil
}

// strVal reads a string field; null reads as nil.
func (s *scanner) strVal(field string) ([]byte, error) {
	switch s.peek() {
	case '"':
		return s.str()
	case 'n':
		if s.null() {
			return nil, nil
		}
	}
	return nil, s.typeErr(field, "string")
}

// text reads a string, or a number kept as its literal text (some agents send
// numeric header values or rule ids); null reads as nil.
func (s *scanner) text(field string) ([]byte, error) {
	switch c := s.peek(); {
	case c == '"':
		return s.str()
	case c == 'n':
		if s.null() {
			return nil, nil
		}
	case c == '-' || (c >= '0' && c <= '9'):
		start := s.i
		if _, err := s.number(); err != nil {
			return nil, err
		}
		return s.b[start:s.i:s.i], nil
	}
	return nil, s.typeErr(field, "string")
}

// unescape decodes the JSON escapes of src into dst and returns the length
// written. dst may be src itself (the write index never passes the read
// index) or nil to validate only. Lone surrogates become U+FFFD, as in
// encoding/json.
func unescape(dst, src []byte) (int, bool) {
	w := 0
	for i := 0; i < len(src); {
		c := src[i]
		if c != '\\' {
			if dst != nil {
				dst[w] = c
			}
			w++
			i++
			continue
		}
		if i+1 >= len(src) {
			return 0, false
		}
		switch src[i+1] {
		case '"', '\\', '/':
			c = src[i+1]
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'u':
			r, ok := hex4(src, i+2)
			if !ok {
				return 0, false
			}
			i += 6
			if r >= 0xD800 && r < 0xE000 {
				if r < 0xDC00 && i+1 < len(src) && src[i] == '\\' && src[i+1] == 'u' {
					if lo, ok := hex4(src, i+2); ok && lo >= 0xDC00 && lo < 0xE000 {
						r = 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00)
						i += 6
					} else {
						r = utf8.RuneError
					}
				} else {
					r = utf8.RuneError
				}
			}
			if dst != nil {
				w += utf8.EncodeRune(dst[w:], r)
			} else {
				w += utf8.RuneLen(r)
			}
			continue
		default:
			return 0, false
		}
		if dst != nil {
			dst[w] = c
		}
		w++
		i += 2
	}
	return w, true
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// number scans a JSON number and reports whether it is an integer (no
// fraction or exponent).
func (s *scanner) number() (isInt bool, err error) {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b):
		s.i = i
		return false, s.synErr("unexpected end of input")
	case b[i] == '0':
		i++
	case b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		s.i = i
		return false, s.synErr("invalid number")
	}
	isInt = true
	if i < len(b) && b[i] == '.' {
		isInt = false
		i++
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			s.i = i
			return false, s.synErr("invalid number")
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		isInt = false
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		d := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		if i == d {
			s.i = i
			return false, s.synErr("invalid number")
		}
	}
	s.i = i
	return isInt, nil
}

// u64 reads an unsigned integer no larger than max. ok is false for null
// (the caller keeps its default).
func (s *scanner) u64(field string, max uint64) (v uint64, ok bool, err error) {
	c := s.peek()
	if c == 'n' && s.null() {
		return 0, false, nil
	}
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.typeErr(field, "unsigned integer")
	}
	start := s.i
	isInt, err := s.number()
	if err != nil {
		return 0, false, err
	}
	if !isInt || c == '-' {
		return 0, false, s.fieldErr(field, "expected unsigned integer")
	}
	for _, d := range s.b[start:s.i] {
		x := uint64(d - '0')
		if v > (math.MaxUint64-x)/10 {
			return 0, false, s.fieldErr(field, "number out of range")
		}
		v = v*10 + x
	}
	if v > max {
		return 0, false, s.fieldErr(field, "number out of range")
	}
	return v, true, nil
}

// i64 reads a signed integer within [min, max]; ok is false for null.
func (s *scanner) i64(field string, min, max int64) (v int64, ok bool, err error) {
	c := s.peek()
	if c == 'n' && s.null() {
		return 0, false, nil
	}
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.typeErr(field, "integer")
	}
	start := s.i
	isInt, err := s.number()
	if err != nil {
		return 0, false, err
	}
	if !isInt {
		return 0, false, s.fieldErr(field, "expected integer")
	}
	digits := s.b[start:s.i]
	neg := digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	// Accumulate the magnitude as uint64: |MinInt64| does not fit an int64.
	var u uint64
	for _, d := range digits {
		x := uint64(d - '0')
		if u > (math.MaxUint64-x)/10 {
			return 0, false, s.fieldErr(field, "number out of range")
		}
		u = u*10 + x
	}
	if neg {
		if u > 1<<63 {
			return 0, false, s.fieldErr(field, "number out of range")
		}
		v = int64(-u) // two's complement: -(1<<63) is MinInt64
	} else {
		if u > math.MaxInt64 {
			return 0, false, s.fieldErr(field, "number out of range")
		}
		v = int64(u)
	}
	if v < min || v > max {
		return 0, false, s.fieldErr(field, "number out of range")
	}
	return v, true, nil
}

// f64 reads a finite number; ok is false for null.
func (s *scanner) f64(field string) (v float64, ok bool, err error) {
	c := s.peek()
	if c == 'n' && s.null() {
		return 0, false, nil
	}
	if c != '-' && (c < '0' || c > '9') {
		return 0, false, s.typeErr(field, "number")
	}
	start := s.i
	if _, err := s.number(); err != nil {
		return 0, false, err
	}
	lit := s.b[start:s.i]
	// unsafe.String avoids copying the literal; ParseFloat does not keep it
	// past the call on success, and its error is discarded.
	v, perr := strconv.ParseFloat(unsafe.String(&lit[0], len(lit)), 64)
	if perr != nil || math.IsInf(v, 0) || math.IsNaN(v) {
		return 0, false, s.fieldErr(field, "number out of range")
	}
	return v, true, nil
}

// boolVal reads a boolean; null reads as false.
func (s *scanner) boolVal(field string) (bool, error) {
	switch s.peek() {
	case 't':
		if len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "true" {
			s.i += 4
			return true, nil
		}
	case 'f':
		if len(s.b)-s.i >= 5 && string(s.b[s.i:s.i+5]) == "false" {
			s.i += 5
			return false, nil
		}
	case 'n':
		if s.null() {
			return false, nil
		}
	}
	return false, s.typeErr(field, "boolean")
}

// skip validates and steps over any JSON value without writing to the
// buffer (so skipped values, like audit "custom", stay verbatim).
func (s *scanner) skip() error {
	switch c := s.peek(); {
	case c == '{':
		s.i++
		if err := s.enter(); err != nil {
			return err
		}
		for n := 0; ; {
			more, err := s.member(&n)
			if err != nil || !more {
				return err
			}
			if err := s.skipString(); err != nil {
				return err
			}
			if err := s.colon(); err != nil {
				return err
			}
			if err := s.skip(); err != nil {
				return err
			}
		}
	case c == '[':
		s.i++
		if err := s.enter(); err != nil {
			return err
		}
		for n := 0; ; {
			more, err := s.elem(&n)
			if err != nil || !more {
				return err
			}
			if err := s.skip(); err != nil {
				return err
			}
		}
	case c == '"':
		return s.skipString()
	case c == 't':
		return s.literal("true")
	case c == 'f':
		return s.literal("false")
	case c == 'n':
		return s.literal("null")
	case c == '-' || (c >= '0' && c <= '9'):
		_, err := s.number()
		return err
	case c == 0 && s.i >= len(s.b):
		return s.synErr("unexpected end of input")
	}
	return s.synErr("invalid character")
}

func (s *scanner) skipString() error {
	start, end, esc, err := s.span()
	if err != nil {
		return err
	}
	if esc {
		if _, ok := unescape(nil, s.b[start:end]); !ok {
			return s.synErr("invalid escape in string")
		}
	}
	return nil
}

func (s *scanner) literal(lit string) error {
	if len(s.b)-s.i >= len(lit) && string(s.b[s.i:s.i+len(lit)]) == lit {
		s.i += len(lit)
		return nil
	}
	return s.synErr("invalid literal")
}

// validJSON reports whether b is exactly one JSON value (with optional
// surrounding whitespace), without modifying b.
func validJSON(b []byte) bool {
	s := newScanner(b)
	if s.skip() != nil {
		return false
	}
	s.ws()
	return s.i == len(b)
}

// lower lower-cases ASCII letters in place.
func lower(b []byte) {
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			b[i] = c + ('a' - 'A')
		}
	}
}
