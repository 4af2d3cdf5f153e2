package exchange

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/clock"
	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelimit"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Route matching beyond host and path prefix, and the route's actions.
//
// Match order. The host picks the routes tried, best host first (exact,
// then the longest wildcard, then the catch-all), as before. Among the
// routes of one host they are tried in this order, and the first whose
// every condition holds wins: exact paths, then path regular
// expressions, then path prefixes longest first; routes of one rank in
// the order of the file. When no route of a host matches, the next
// host's routes are tried. Conditions are checked on the normalised path
// and the canonical host routing always used, the method as received,
// the client's header fields as received (a name may appear several
// times: a condition holds when one of them matches) and the query as
// sent (percent-encoded).
//
// Every expression is compiled once, when the table is built.

// Path match kinds, in match order.
const (
	matchExact uint8 = iota
	matchRegex
	matchPrefix
)

// String match kinds.
const (
	strPresent uint8 = iota
	strExact
	strPrefix
	strRegex
)

type strMatch struct {
	name   []byte
	kind   uint8
	val    []byte
	re     *regexp.Regexp
	invert bool
}

func compileStrMatch(m *config.StringMatch) (strMatch, error) {
	s := strMatch{name: []byte(m.Name), invert: m.Invert}
	switch {
	case m.Present:
		s.kind = strPresent
	case m.Exact != nil:
		s.kind, s.val = strExact, []byte(*m.Exact)
	case m.Prefix != "":
		s.kind, s.val = strPrefix, []byte(m.Prefix)
	default:
		re, err := config.CompileRegex(m.Regex)
		if err != nil {
			return s, err
		}
		s.kind, s.re = strRegex, re
	}
	return s, nil
}

// value reports whether v satisfies the condition (invert aside).
func (m *strMatch) value(v []byte) bool {
	switch m.kind {
	case strPresent:
		return true
	case strExact:
		return string(v) == string(m.val)
	case strPrefix:
		return len(v) >= len(m.val) && string(v[:len(m.val)]) == string(m.val)
	}
	return m.re.Match(v)
}

// routeOp is a route's header operation; name and value live as long as
// the table.
type routeOp struct {
	op          protocol.HeaderOpKind
	name, value []byte
}

func compileOps(h *config.HeaderOps) ([]routeOp, error) {
	var ops []routeOp
	for _, n := range h.Remove {
		ops = append(ops, routeOp{op: protocol.HeaderRemove, name: []byte(n)})
	}
	for _, hv := range h.Set {
		ops = append(ops, routeOp{op: protocol.HeaderSet, name: []byte(hv.Name), value: []byte(hv.Value)})
	}
	for _, hv := range h.Add {
		ops = append(ops, routeOp{op: protocol.HeaderAdd, name: []byte(hv.Name), value: []byte(hv.Value)})
	}
	// The rules of agents' operations (checkOp) hold for the route's:
	// the configuration checks them too, and this keeps the two from
	// drifting apart.
	for _, o := range ops {
		p := protocol.HeaderOp{Op: o.op, Name: o.name, Value: o.value}
		if _, why := checkOp(nil, &p); why != "" {
			return nil, fmt.Errorf("header %q: %s", o.name, why)
		}
	}
	return ops, nil
}

// routeExt is what a route adds to host and path prefix.
type routeExt struct {
	pathKind uint8
	exact    []byte
	pathRe   *regexp.Regexp
	methods  [][]byte
	headers  []strMatch
	query    []strMatch

	// Actions.
	rwPrefix   []byte // prefix rewrite (nil: none)
	hasRwPfx   bool
	rwRe       *regexp.Regexp
	rwSub      []byte
	reqOps     []routeOp
	respOps    []routeOp
	direct     *config.DirectResponse
	directType []byte
	redirect   *config.Redirect

	// Timeouts and retries (forward.go).
	timeout, upTimeout time.Duration
	retry              *retryPolicy

	// Local rate limit (nil: none).
	limit *routeLimit
	// Global rate limit (nil: none; globalrl.go).
	global *globalLimit
}

// compileRoute resolves rc's matching and actions into r.
// State that outlives a reload (a retry policy's counters, a rate
// limit's buckets) is carried over from prev's route of the same name
// when its settings did not change.
func compileRoute(rc *config.Route, r *route, prev *Table) error {
	x := &r.ext
	switch {
	case rc.Path != "":
		x.pathKind, x.exact = matchExact, []byte(rc.Path)
	case rc.PathRegex != "":
		re, err := config.CompileRegex(rc.PathRegex)
		if err != nil {
			return fmt.Errorf("%w: route %q: path_regex: %v", ErrConfig, rc.Name, err)
		}
		x.pathKind, x.pathRe = matchRegex, re
	default:
		x.pathKind = matchPrefix
	}
	for _, m := range rc.Methods {
		x.methods = append(x.methods, []byte(strings.ToUpper(m)))
	}
	for i := range rc.Headers {
		m, err := compileStrMatch(&rc.Headers[i])
		if err != nil {
			return fmt.Errorf("%w: route %q: headers[%d]: %v", ErrConfig, rc.Name, i, err)
		}
		x.headers = append(x.headers, m)
	}
	for i := range rc.Query {
		m, err := compileStrMatch(&rc.Query[i])
		if err != nil {
			return fmt.Errorf("%w: route %q: query[%d]: %v", ErrConfig, rc.Name, i, err)
		}
		x.query = append(x.query, m)
	}
	if rw := rc.Rewrite; rw != nil {
		switch {
		case rw.Prefix != nil:
			x.rwPrefix, x.hasRwPfx = []byte(*rw.Prefix), true
		case rw.Regex != nil:
			re, err := regexp.Compile(rw.Regex.Pattern)
			if err != nil {
				return fmt.Errorf("%w: route %q: rewrite.regex: %v", ErrConfig, rc.Name, err)
			}
			x.rwRe, x.rwSub = re, []byte(rw.Regex.Substitution)
		}
	}
	var err error
	if x.reqOps, err = compileOps(&rc.RequestHeaders); err != nil {
		return fmt.Errorf("%w: route %q: request_headers: %v", ErrConfig, rc.Name, err)
	}
	if x.respOps, err = compileOps(&rc.ResponseHeaders); err != nil {
		return fmt.Errorf("%w: route %q: response_headers: %v", ErrConfig, rc.Name, err)
	}
	if d := rc.DirectResponse; d != nil {
		x.direct = d
		x.directType = valueTextPlain
		if d.ContentType != "" {
			x.directType = []byte(d.ContentType)
		}
	}
	x.redirect = rc.Redirect
	x.timeout, x.upTimeout = rc.Timeout, rc.UpstreamTimeout
	var old *route
	if prev != nil {
		for _, pr := range prev.routes {
			if pr.name == rc.Name {
				old = pr
				break
			}
		}
	}
	if rc.Retry != nil {
		// A reload that keeps the policy keeps its counters: requests
		// still on the old table count in the same budget.
		if old != nil && old.ext.retry != nil && old.ext.retry.cfg.Equal(rc.Retry) {
			x.retry = old.ext.retry
		} else {
			x.retry = newRetryPolicy(rc.Retry)
		}
	}
	if rc.GlobalRateLimit != nil {
		x.global = newGlobalLimit(rc.GlobalRateLimit)
	}
	if rc.RateLimit != nil {
		// ... and a kept limit its buckets: a reload is no way past it.
		if old != nil && old.ext.limit != nil && old.ext.limit.cfg == *rc.RateLimit {
			x.limit = old.ext.limit
		} else {
			x.limit = newRouteLimit(rc.Name, rc.RateLimit)
		}
	}
	return nil
}

// rank orders the routes of one host (match order above).
func (r *route) rank() (uint8, int) { return r.ext.pathKind, -len(r.prefix) }

// matches reports whether every condition of r holds for the request.
func (r *route) matches(ex *Exchange, path []byte) bool {
	x := &r.ext
	switch x.pathKind {
	case matchExact:
		if string(path) != string(x.exact) {
			return false
		}
	case matchRegex:
		if !x.pathRe.Match(path) {
			return false
		}
	default:
		if len(path) < len(r.prefix) || string(path[:len(r.prefix)]) != string(r.prefix) {
			return false
		}
	}
	if len(x.methods) > 0 {
		ok := false
		for _, m := range x.methods {
			if string(m) == string(ex.head.Method) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for i := range x.headers {
		m := &x.headers[i]
		found := false
		for _, f := range ex.head.Fields {
			if eqFold(f.Name, m.name) && m.value(f.Value) {
				found = true
				break
			}
		}
		if found == m.invert {
			return false
		}
	}
	if len(x.query) > 0 {
		q := queryOf(ex.head.Target)
		for i := range x.query {
			m := &x.query[i]
			if queryMatch(q, m) == m.invert {
				return false
			}
		}
	}
	return true
}

// queryOf is the query of an origin-form target (nil: none).
func queryOf(target []byte) []byte {
	for i, c := range target {
		if c == '?' {
			return target[i+1:]
		}
	}
	return nil
}

// queryMatch reports whether a parameter of q called m.name has a value
// that satisfies m (a parameter without '=' has an empty value).
func queryMatch(q []byte, m *strMatch) bool {
	for len(q) > 0 {
		var p []byte
		if i := indexByte(q, '&'); i >= 0 {
			p, q = q[:i], q[i+1:]
		} else {
			p, q = q, nil
		}
		name, val := p, []byte(nil)
		if i := indexByte(p, '='); i >= 0 {
			name, val = p[:i], p[i+1:]
		}
		if string(name) == string(m.name) && m.value(val) {
			return true
		}
	}
	return false
}

// routeState is the request's part of its route's actions.
type routeState struct {
	target    []byte // the rewritten target the upstream gets (nil: the client's)
	targetBuf []byte
	queryBuf  []byte // the other target buffer, for an agent's query rewrite (query.go)
	locBuf    []byte
	limitBuf  []byte
	budgeted  bool // the request counts in its route's active requests

	// Rate limit fields for the response (limitFields): the local limits
	// with headers: always that allowed the request (a listener's and a
	// route's at most), and the fields of a global limit's OK answer.
	allowed  [2]allowedLimit
	nAllowed uint8
	rlFields []Field
	rlBuf    []byte
}

// allowedLimit is a local limit that allowed the request, for its
// RateLimit field.
type allowedLimit struct {
	rl         *routeLimit
	rem, reset int64 // requests left; seconds until the bucket is full
}

func (s *routeState) reset() {
	*s = routeState{targetBuf: trim(s.targetBuf, 8<<10), queryBuf: trim(s.queryBuf, 8<<10), locBuf: trim(s.locBuf, 8<<10), limitBuf: trim(s.limitBuf, 256),
		rlFields: trimList(s.rlFields, 64), rlBuf: trim(s.rlBuf, 1024)}
}

// fwdTarget is the target the upstream gets.
func (ex *Exchange) fwdTarget() []byte {
	if ex.rs.target != nil {
		return ex.rs.target
	}
	return ex.head.Target
}

// matchedLen is the length of the path the route's path_prefix or path
// matched (for prefix rewrites).
func (r *route) matchedLen() int {
	if r.ext.pathKind == matchExact {
		return len(r.ext.exact)
	}
	return len(r.prefix)
}

// rewrite builds the upstream's target from the normalised path the
// route matched, the rewrite applied, percent-encoded again where the
// path needs it, and the client's query.
func (ex *Exchange) rewrite() {
	x := &ex.rt.ext
	path := ex.head.Path
	if len(ex.head.Target) == 0 || ex.head.Target[0] != '/' {
		return // OPTIONS *: no path to rewrite
	}
	buf := ex.rs.targetBuf[:0]
	switch {
	case x.hasRwPfx:
		buf = appendPath(buf, x.rwPrefix)
		buf = appendPath(buf, path[ex.rt.matchedLen():])
	case x.rwRe != nil:
		// ReplaceAll allocates; a regex rewrite is not on the 0-alloc path.
		out := x.rwRe.ReplaceAll(path, x.rwSub)
		if len(out) == 0 || out[0] != '/' {
			buf = append(buf, '/')
		}
		buf = appendPath(buf, out)
	default:
		return
	}
	if q := queryOf(ex.head.Target); q != nil {
		buf = append(buf, '?')
		buf = append(buf, q...)
	}
	ex.rs.targetBuf = buf
	ex.rs.target = buf
	ex.viewDirty = true
}

// appendPath appends p percent-encoding what is not a path character
// (RFC 3986 pchar and '/').
func appendPath(dst, p []byte) []byte {
	const hexd = "0123456789ABCDEF"
	for _, c := range p {
		if pathChar[c] {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hexd[c>>4], hexd[c&15])
	}
	return dst
}

var pathChar = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-._~!$&'()*+,;=:@/" {
		t[c] = true
	}
	return
}()

// applyRouteReqOps applies the route's request header operations to the
// upstream's header list. They are the sidecar's configuration, not the
// client's request: the forwarded view shows them, the client's view
// (client_request) does not.
func (ex *Exchange) applyRouteReqOps() {
	for _, o := range ex.rt.ext.reqOps {
		ex.hdr = applyIn(ex.hdr, o.op, o.name, o.value)
	}
	ex.viewDirty = true
}

// applyRouteRespOps applies the route's response header operations to
// the staged response (before the response-phase agents see it).
func (ex *Exchange) applyRouteRespOps() {
	ops := ex.rt.ext.respOps
	if len(ops) == 0 {
		return
	}
	r := &ex.resp
	r.Origin = nil
	for _, o := range ops {
		r.Fields = applyRespOp(r.Fields, o.op, o.name, o.value)
	}
}

// directResponse stages the route's direct response.
func (ex *Exchange) directResponse() {
	d := ex.rt.ext.direct
	r := ex.stage(d.Status)
	if len(d.Body) > 0 {
		r.Fields = append(r.Fields, Field{Name: hdrContentType, Value: ex.rt.ext.directType})
	}
	r.Body = s2b(d.Body)
	ex.applyRouteRespOps()
	ex.finishResponseHeaders()
	ex.answered = true
	ex.status = d.Status
	ex.outcome = "direct response"
}

var (
	slash       = []byte("/")
	schemeHTTPS = []byte("https://")
	schemeHTTP  = []byte("http://")
)

// redirectResponse stages the route's redirect: the request's URL with
// the parts the route gives replaced.
func (ex *Exchange) redirectResponse() {
	rd := ex.rt.ext.redirect
	b := ex.rs.locBuf[:0]
	switch {
	case rd.HTTPS || (ex.lst.TLS && rd.Host == ""):
		b = append(b, schemeHTTPS...)
	default:
		b = append(b, schemeHTTP...)
	}
	switch {
	case rd.Host != "":
		b = append(b, rd.Host...)
	case rd.HTTPS && !ex.lst.TLS:
		// An https upgrade: the client's port is the plain listener's.
		b = append(b, ex.host...)
	default:
		b = append(b, ex.hostFull...)
	}
	target := ex.head.Target
	if len(target) == 0 || target[0] != '/' {
		target = slash // OPTIONS *
	}
	rawPath := target
	if i := indexByte(target, '?'); i >= 0 {
		rawPath = target[:i]
	}
	switch {
	case rd.Path != "":
		b = append(b, rd.Path...)
	case rd.PrefixRewrite != nil:
		b = append(b, *rd.PrefixRewrite...)
		b = appendPath(b, ex.head.Path[ex.rt.matchedLen():])
	default:
		b = append(b, rawPath...)
	}
	if q := queryOf(target); q != nil && !rd.StripQuery {
		b = append(b, '?')
		b = append(b, q...)
	}
	ex.rs.locBuf = b
	r := ex.stage(rd.Status)
	r.Fields = append(r.Fields, Field{Name: hdrLocation, Value: b})
	ex.applyRouteRespOps()
	ex.finishResponseHeaders()
	ex.answered = true
	ex.status = rd.Status
	ex.outcome = "redirect"
}

// routeLimit is a route's local rate limit.
type routeLimit struct {
	cfg     config.RateLimit
	l       *ratelimit.Limiter
	key     uint8
	header  []byte
	after   bool // after the agents
	policy  []byte
	name    []byte
	limited atomic.Uint64
	always  bool // headers: always
}

const (
	keyNone uint8 = iota
	keyClientIP
	keyHeader
	keyMethodPath
)

func newRouteLimit(name string, c *config.RateLimit) *routeLimit {
	rl := &routeLimit{
		cfg:    *c,
		l:      ratelimit.New(c.Requests, c.Period, c.Burst, c.MaxKeys),
		header: []byte(c.Header),
		after:  c.Stage == config.RateAfterAgents,
		always: c.Headers == config.RateHeadersAlways,
	}
	switch c.Key {
	case config.RateKeyClientIP:
		rl.key = keyClientIP
	case config.RateKeyHeader:
		rl.key = keyHeader
	case config.RateKeyMethodPath:
		rl.key = keyMethodPath
	}
	w := ceilSeconds(c.Period)
	// draft-ietf-httpapi-ratelimit-headers: a quota of q requests per w
	// seconds, named by the route.
	rl.name = []byte(strconv.Quote(name))
	rl.policy = []byte(fmt.Sprintf("%s;q=%d;w=%d", rl.name, c.Requests, w))
	return rl
}

var (
	hdrRetryAfter      = []byte("Retry-After")
	hdrRateLimitPolicy = []byte("RateLimit-Policy")
	hdrRateLimit       = []byte("RateLimit")
)

// clientKey is the address a client is limited by: the connection's
// peer, or with trust_forwarded the last X-Forwarded-For entry (what
// the trusted proxy in front saw).
func (ex *Exchange) clientKey() []byte {
	ip := ex.conn.ClientIP
	if !ex.lst.TrustForwarded {
		return ip
	}
	var last []byte
	for _, f := range ex.head.Fields {
		if foldEq(f.Name, "x-forwarded-for") {
			last = f.Value
		}
	}
	if last == nil {
		return ip
	}
	for i := len(last) - 1; i >= 0; i-- {
		if last[i] == ',' {
			last = last[i+1:]
			break
		}
	}
	last = trimOWS(last)
	if len(last) == 0 {
		return ip
	}
	return last
}

// rateLimited decides the route's limit for the request; false means a
// 429 is staged.
func (ex *Exchange) rateLimited(rl *routeLimit) bool {
	now := clock.Mono()
	var d ratelimit.Decision
	switch rl.key {
	case keyNone:
		d = rl.l.AllowOne(now)
	case keyClientIP:
		d = rl.l.Allow(rl.l.HashBytes(ex.clientKey()), now)
	case keyHeader:
		d = rl.l.Allow(rl.l.HashBytes(ex.headField(rl.header)), now)
	default:
		d = rl.l.Allow(rl.l.Hash2(ex.head.Method, ex.head.Path), now)
	}
	if d.Allowed {
		if rl.always && int(ex.rs.nAllowed) < len(ex.rs.allowed) {
			ex.rs.allowed[ex.rs.nAllowed] = allowedLimit{rl: rl, rem: d.Remaining, reset: ceilSeconds(d.Reset)}
			ex.rs.nAllowed++
		}
		return false
	}
	rl.limited.Add(1)
	ex.core.stats.rateLimited.Add(1)
	ex.tooMany(rl.name, ceilSeconds(d.RetryAfter), rl.policy, "rate limited")
	return true
}

// tooMany stages the 429 of the limit called name (quoted, as the
// RateLimit fields say it) that lets a request through again in secs
// seconds: Retry-After, RateLimit-Policy (policy; nil: none) and
// RateLimit, formatted into the request's buffer (no allocation once it
// has grown).
func (ex *Exchange) tooMany(name []byte, secs int64, policy []byte, outcome string) {
	b := ex.rs.limitBuf[:0]
	b = strconv.AppendInt(b, secs, 10)
	n := len(b)
	b = append(b, name...)
	b = append(b, ";r=0;t="...)
	b = strconv.AppendInt(b, secs, 10)
	ex.rs.limitBuf = b
	ex.local(429, "too many requests", outcome)
	r := &ex.resp
	r.Fields = append(r.Fields, Field{Name: hdrRetryAfter, Value: b[:n:n]})
	if policy != nil {
		r.Fields = append(r.Fields, Field{Name: hdrRateLimitPolicy, Value: policy})
	}
	r.Fields = append(r.Fields, Field{Name: hdrRateLimit, Value: b[n:]})
}

func ceilSeconds(d time.Duration) int64 { return int64((d + time.Second - 1) / time.Second) }

// limitFields adds to the staged response the RateLimit-Policy and
// RateLimit fields of the local limits with headers: always that allowed
// the request, and the fields of a global limit's OK answer
// (response_headers_to_add, and with headers: always the draft fields of
// its statuses). Formatted into the request's buffer: no allocation once
// it has grown.
func (ex *Exchange) limitFields() {
	rs := &ex.rs
	r := &ex.resp
	b := rs.rlBuf[:0]
	for i := 0; i < int(rs.nAllowed); i++ {
		a := &rs.allowed[i]
		n := len(b)
		b = append(b, a.rl.name...)
		b = append(b, ";r="...)
		b = strconv.AppendInt(b, a.rem, 10)
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, a.reset, 10)
		r.Fields = append(r.Fields, Field{Name: hdrRateLimitPolicy, Value: a.rl.policy}, Field{Name: hdrRateLimit, Value: b[n:len(b):len(b)]})
	}
	rs.rlBuf = b
	r.Fields = append(r.Fields, rs.rlFields...)
	r.Origin = nil
}
