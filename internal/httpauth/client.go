// Package httpauth runs HTTP forward-auth services (nginx's auth_request,
// Traefik's ForwardAuth; oauth2-proxy, Authelia, …) as agents: one
// subrequest per HTTP request to the configured URL, without a body,
// carrying the client's headers and the request's method, URI, host and
// protocol in X-Forwarded-* (Traefik: a GET, as Traefik sends) or
// X-Original-* headers (nginx: the request's own method, as an nginx
// subrequest inherits it).
//
// A 2xx answer lets the request go on, with the configured headers of
// the answer copied onto the upstream request (the client's own headers
// of those names removed first); any other answer is the client's
// response: its status, its headers (Location and Set-Cookie included)
// and its body, bounded. The transport is an authcall.Link, so the answer
// becomes a protocol.Decision that the dataplane's rules and limits apply
// to as to any agent's, and a service that cannot be asked in time
// fails the request per the agent's failure policy.
//
// The subrequests go over the transport's own keep-alive connections,
// their answers read by fasthttp's parser, the product's HTTP/1 engine:
// strict, the head bounded (64 KiB), the body read only as far as
// needed; each subrequest is bounded by its deadline and ends soon after
// its client goes away.
package httpauth

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/authcall"
	"github.com/zentinelproxy/sidecar/protocol"
)

// event indexes the transport's own counters.
type event int

const (
	evChecks event = iota
	evOK
	evDenied
	evTruncated
	evProbeFailed
	evPipelined
	numEvents
)

// EventNames are the labels of the transport's counters, by event
// (exported as sidecar_authz_events_total).
var EventNames = [numEvents]string{"checks", "ok", "denied", "bodies_truncated", "probes_failed", "pipelined"}

var _ agentmux.Reporter = (*Client)(nil)

// Client asks one forward-auth service; it implements agentmux.Agent
// with one session, whose link makes the subrequests over a keep-alive
// pool of connections (at most MaxInFlight).
type Client struct {
	*agentmux.Pool
	cfg    Config
	pool   connPool
	tls    *tls.Config // nil: http://
	net    string      // "tcp" or "unix"
	addr   string      // host:port or socket path dialed
	host   string      // the Host header
	target string      // the request target (path and query)
	// reqNames are the lowercased RequestHeaders; respNames the
	// lowercased ResponseHeaders, the names of their operations.
	reqNames  [][]byte
	respNames [][]byte
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	log       zerolog.Logger

	counts [numEvents]atomic.Uint64
}

func (c *Client) count(e event) { c.counts[e].Add(1) }

// Counts returns the transport's counters by EventNames.
func (c *Client) Counts() map[string]uint64 {
	out := make(map[string]uint64, numEvents)
	for i := range c.counts {
		out[EventNames[i]] = c.counts[i].Load()
	}
	return out
}

// Snapshot implements agentmux.Reporter: the pool's session and counters,
// and the transport's events (Counts).
func (c *Client) Snapshot() agentmux.AgentStatus {
	st := c.Pool.Snapshot()
	st.Events = c.Counts()
	return st
}

// Capabilities are a forward-auth service's: the request headers only.
func Capabilities() protocol.Capabilities {
	return protocol.Capabilities{HandlesRequestHeaders: true, SupportsCancellation: true}
}

// NewClient validates cfg, reads its TLS files and starts probing the
// service; Begin fails with agentmux.ErrAgentUnavailable until a probe
// was answered.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	u, err := url.Parse(cfg.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: agent %q: %v", ErrHTTPAuthConfig, cfg.Name, err)
	}
	var tc *tls.Config
	port := "80"
	if u.Scheme == "https" {
		if tc, err = cfg.TLS.ClientTLS(); err != nil {
			return nil, fmt.Errorf("%w: agent %q: %v", ErrHTTPAuthConfig, cfg.Name, err)
		}
		if tc.ServerName == "" {
			tc.ServerName = u.Hostname()
		}
		port = "443"
	}
	if u.Port() != "" {
		port = u.Port()
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		Pool:   agentmux.NewPool(cfg.Name, "http_auth"),
		cfg:    cfg,
		tls:    tc,
		net:    "tcp",
		addr:   net.JoinHostPort(u.Hostname(), port),
		host:   u.Host,
		target: u.RequestURI(),
		ctx:    ctx,
		cancel: cancel,
		log:    cfg.Logger.With().Str("address", cfg.URL).Logger(),
	}
	c.pool.maxIdle = cfg.MaxInFlight
	c.pool.wake = make(chan struct{}, 1)
	if cfg.UnixSocket != "" {
		c.net, c.addr = "unix", cfg.UnixSocket
	}
	for _, n := range cfg.RequestHeaders {
		c.reqNames = append(c.reqNames, []byte(strings.ToLower(n)))
	}
	for _, n := range cfg.ResponseHeaders {
		c.respNames = append(c.respNames, []byte(strings.ToLower(n)))
	}
	c.wg.Add(2)
	go c.reap()
	go c.maintain()
	return c, nil
}

// probe asks the service once, without a request's headers: any HTTP
// answer (a 401 included) is a service that answers.
func (c *Client) probe() error {
	cl := c.pool.getCall()
	defer c.pool.putCall(cl)
	cl.buf = c.appendStart(cl.buf[:0], "GET")
	cl.buf = append(cl.buf, "User-Agent: "+userAgent+"\r\n\r\n"...)
	_, err := c.roundTrip(cl, agentmux.Wait{Deadline: time.Now().Add(c.cfg.DialTimeout), Cancel: c.ctx.Done()}, false, false)
	return err
}

// maintain probes the service: ready (one session in the pool) while
// probes are answered, every HealthInterval; unready, probed again with
// a backoff from 250ms to HealthInterval, once one fails.
func (c *Client) maintain() {
	defer c.wg.Done()
	var sess *agentmux.Session
	drop := func(err error) {
		if sess == nil {
			return
		}
		c.Remove(sess)
		sess.Fail(err)
		_ = sess.Close()
		sess = nil
	}
	defer drop(errors.New("closed"))
	retry := 250 * time.Millisecond
	for {
		wait := c.cfg.HealthInterval
		if err := c.probe(); err != nil {
			if c.ctx.Err() != nil {
				return
			}
			c.count(evProbeFailed)
			c.SetLastError(fmt.Errorf("authorization service %s: %v", c.cfg.URL, err))
			if sess != nil {
				c.log.Warn().Err(err).Msg("authorization service not answering")
			}
			drop(err)
			wait = retry
			retry = min(2*retry, c.cfg.HealthInterval)
		} else {
			retry = 250 * time.Millisecond
			if sess == nil {
				l := authcall.NewLink(c.cfg.Name, checker{c}, false)
				sess = agentmux.NewSession(l, Capabilities(), agentmux.SessionConfig{
					Name:           c.cfg.Name,
					MaxInFlight:    c.cfg.MaxInFlight,
					MaxQueue:       c.cfg.MaxQueue,
					MessageTimeout: c.cfg.MessageTimeout,
				})
				l.SetSession(sess)
				c.SetLastError(nil)
				c.Add(sess)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
	}
}

// Close ends every subrequest and the connections.
func (c *Client) Close() error {
	err := c.Pool.Close()
	c.cancel()
	c.pool.close()
	c.wg.Wait()
	return err
}

const userAgent = "zentinel-sidecar/0.1 http_auth"

// checker makes the subrequests of the client's session.
type checker struct{ c *Client }

var _ authcall.WaitChecker = checker{}

// Check implements authcall.Checker: CheckWait bounded by ctx.
func (k checker) Check(ctx context.Context, m *protocol.RequestHeaders, body []byte, d *protocol.Decision) error {
	return k.CheckWait(agentmux.WaitFor(ctx), m, body, d)
}

// Abort implements authcall.WaitChecker: the subrequests in flight end.
func (k checker) Abort() { k.c.pool.abort(true) }

// CheckWait implements authcall.WaitChecker: one subrequest.
func (k checker) CheckWait(w agentmux.Wait, m *protocol.RequestHeaders, _ []byte, d *protocol.Decision) error {
	c := k.c
	c.count(evChecks)
	cl := c.pool.getCall()
	var err error
	defer func() {
		if !errors.Is(err, errAbandoned) {
			c.pool.putCall(cl)
		}
	}()
	method := "GET"
	if c.cfg.Style == StyleNginx && len(m.Method) > 0 {
		method = string(m.Method) // no copy: the conversion does not escape
	}
	if cl.buf, err = c.appendRequest(cl.buf[:0], method, m); err != nil {
		return err
	}
	var truncated bool
	truncated, err = c.roundTrip(cl, w, method == "HEAD", method == "GET")
	if err != nil {
		return err
	}
	h := &cl.resp.Header
	if st := h.StatusCode(); st >= 200 && st <= 299 {
		c.count(evOK)
		d.Kind = protocol.DecisionAllow
		k.copyHeaders(m, h, d)
		return nil
	}
	c.count(evDenied)
	if truncated {
		c.count(evTruncated)
	}
	d.Kind = protocol.DecisionBlock
	d.Status = h.StatusCode()
	d.Body = append([]byte(nil), cl.body...)
	for name, v := range h.All() {
		if skipResponse(name) || (truncated && asciiEqualFold(name, "content-encoding")) {
			continue
		}
		d.BlockHeaders = append(d.BlockHeaders, protocol.Header{Name: lower(name), Value: append([]byte(nil), v...)})
	}
	return nil
}

// appendStart appends the request line and Host header to b.
func (c *Client) appendStart(b []byte, method string) []byte {
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, c.target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, c.host...)
	return append(b, "\r\n"...)
}

// errBadRequestHeader: a header of the request cannot be sent on (a
// control character in it).
var errBadRequestHeader = errors.New("request header not valid in a subrequest")

// appendRequest appends the subrequest's head about m to b: the
// client's headers (those the subrequest frames itself, and those it
// sets, left out) and the headers of the style.
func (c *Client) appendRequest(b []byte, method string, m *protocol.RequestHeaders) ([]byte, error) {
	cfg := &c.cfg
	b = c.appendStart(b, method)
	nginx := cfg.Style == StyleNginx
	setFor := !nginx && len(m.Metadata.ClientIP) > 0
	var host []byte
	hasUA := false
	for i := range m.Headers {
		name, v := m.Headers[i].Name, m.Headers[i].Value
		if host == nil && asciiEqualFold(name, "host") {
			host = v
		}
		if skipRequest(name) || c.ownHeader(name, nginx, setFor) {
			continue
		}
		if c.reqNames != nil && !listed(c.reqNames, name) {
			continue
		}
		if !validName(name) || !validValue(v) {
			return b, fmt.Errorf("%w: %q", errBadRequestHeader, name)
		}
		hasUA = hasUA || asciiEqualFold(name, "user-agent")
		b = appendCanonical(b, name)
		b = append(b, ": "...)
		b = append(b, v...)
		b = append(b, "\r\n"...)
	}
	if !validValue(m.URI) || !validValue(m.Method) || !validValue(host) {
		return b, fmt.Errorf("%w: the request line", errBadRequestHeader)
	}
	if nginx {
		b = appendHeader(b, "X-Original-Method", m.Method)
		b = appendHeader(b, "X-Original-URI", m.URI)
	} else {
		proto := "http"
		if len(m.Metadata.TLSVersion) > 0 {
			proto = "https"
		}
		b = appendHeader(b, "X-Forwarded-Method", m.Method)
		b = append(b, "X-Forwarded-Proto: "...)
		b = append(b, proto...)
		b = append(b, "\r\n"...)
		b = appendHeader(b, "X-Forwarded-Host", host)
		b = appendHeader(b, "X-Forwarded-Uri", m.URI)
		if setFor {
			if !validValue(m.Metadata.ClientIP) {
				return b, fmt.Errorf("%w: the client address", errBadRequestHeader)
			}
			b = appendHeader(b, "X-Forwarded-For", m.Metadata.ClientIP)
		}
	}
	if !hasUA {
		b = append(b, "User-Agent: "+userAgent+"\r\n"...)
	}
	return append(b, "\r\n"...), nil
}

// ownHeader reports whether name is a header the subrequest sets itself
// (so that the client's copy of it is not sent too).
func (c *Client) ownHeader(name []byte, nginx, setFor bool) bool {
	if len(name) < 10 || name[0]|0x20 != 'x' {
		return false
	}
	if nginx {
		return asciiEqualFold(name, "x-original-method") || asciiEqualFold(name, "x-original-uri")
	}
	return asciiEqualFold(name, "x-forwarded-method") || asciiEqualFold(name, "x-forwarded-proto") ||
		asciiEqualFold(name, "x-forwarded-host") || asciiEqualFold(name, "x-forwarded-uri") ||
		(setFor && asciiEqualFold(name, "x-forwarded-for"))
}

func appendHeader(b []byte, name string, v []byte) []byte {
	b = append(b, name...)
	b = append(b, ": "...)
	b = append(b, v...)
	return append(b, "\r\n"...)
}

// appendCanonical appends name in the canonical form (X-Auth-User), as
// Go's and most clients send it.
func appendCanonical(b, name []byte) []byte {
	up := true
	for _, ch := range name {
		switch {
		case up && 'a' <= ch && ch <= 'z':
			ch -= 'a' - 'A'
		case !up && 'A' <= ch && ch <= 'Z':
			ch += 'a' - 'A'
		}
		b = append(b, ch)
		up = ch == '-'
	}
	return b
}

// skipRequest are the client headers never sent to the service: the
// subrequest frames itself, asks for no encoding it would have to undo,
// and its hop-by-hop headers are its own.
func skipRequest(name []byte) bool {
	for _, s := range skippedRequest {
		if asciiEqualFold(name, s) {
			return true
		}
	}
	return false
}

var skippedRequest = []string{"host", "content-length", "transfer-encoding", "accept-encoding", "expect",
	"connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection", "proxy-authorization"}

// skipResponse are the headers of a denial not passed to the client: the
// proxy frames the response itself.
func skipResponse(name []byte) bool {
	for _, s := range skippedResponse {
		if asciiEqualFold(name, s) {
			return true
		}
	}
	return false
}

var skippedResponse = []string{"content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
	"upgrade", "proxy-connection", "date", "server"}

// copyHeaders copies the configured headers of a 2xx answer onto the
// upstream request: each configured name (or every client header the
// regex matches) is removed first, then the answer's values added, so
// the upstream never sees a client's own copy of an identity header.
// The names are the client's (shared, never written to); the values are
// copied into one allocation, as the decision outlives the answer.
func (k checker) copyHeaders(m *protocol.RequestHeaders, h *fasthttp.ResponseHeader, d *protocol.Decision) {
	c := k.c
	re := c.cfg.ResponseHeadersRegex
	size := 0
	for name, v := range h.All() {
		if listed(c.respNames, name) || (re != nil && matchName(re, name) && !skipResponse(name)) {
			size += len(v)
		}
	}
	arena := make([]byte, 0, size)
	value := func(v []byte) []byte {
		arena = append(arena, v...)
		return arena[len(arena)-len(v) : len(arena) : len(arena)]
	}
	for _, lname := range c.respNames {
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: lname})
		for name, v := range h.All() {
			if asciiEqualFoldBytes(name, lname) {
				d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderAdd, Name: lname, Value: value(v)})
			}
		}
	}
	if re == nil {
		return
	}
	for i := range m.Headers {
		n := m.Headers[i].Name
		if matchName(re, n) {
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: lower(n)})
		}
	}
	for name, v := range h.All() {
		if listed(c.respNames, name) || !matchName(re, name) || skipResponse(name) {
			continue
		}
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderAdd, Name: lower(name), Value: value(v)})
	}
}

// matchName reports whether the regex matches name as sent or in its
// canonical form (what the regex is documented against).
func matchName(re interface {
	Match([]byte) bool
	MatchString(string) bool
}, name []byte) bool {
	return re.Match(name) || re.MatchString(http.CanonicalHeaderKey(string(name)))
}

// listed reports whether name is one of the lowercased names.
func listed(names [][]byte, name []byte) bool {
	for _, n := range names {
		if asciiEqualFoldBytes(name, n) {
			return true
		}
	}
	return false
}

func lower(b []byte) []byte { return bytes.ToLower(b) }

func asciiEqualFold(b []byte, s string) bool {
	if len(b) != len(s) {
		return false
	}
	for i := range len(b) {
		if toLower(b[i]) != toLower(s[i]) {
			return false
		}
	}
	return true
}

func asciiEqualFoldBytes(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range len(a) {
		if toLower(a[i]) != toLower(b[i]) {
			return false
		}
	}
	return true
}

func toLower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

// validName: a header name that is a token.
func validName(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// validValue: no control character but tab (a CR or LF would end the
// line: a header of the client's making in the subrequest).
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}
