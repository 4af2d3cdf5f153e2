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
// The subrequests go through net/http's client, not fasthttp's: a
// subrequest must end when the client goes away (net/http takes a
// context; fasthttp's client only a deadline), and the service's answer
// is passed to the client, so the strict and bounded response parsing of
// net/http (MaxResponseHeaderBytes) and its TLS setup are worth the
// allocations, which are measured in docs/transports.md.
package httpauth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

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
	numEvents
)

// EventNames are the labels of the transport's counters, by event
// (exported as sidecar_authz_events_total).
var EventNames = [numEvents]string{"checks", "ok", "denied", "bodies_truncated", "probes_failed"}

var _ agentmux.Reporter = (*Client)(nil)

// Client asks one forward-auth service; it implements agentmux.Agent
// with one session, whose link makes the subrequests over a keep-alive
// pool of connections (at most MaxInFlight).
type Client struct {
	*agentmux.Pool
	cfg    Config
	http   *http.Client
	tr     *http.Transport
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	log    zerolog.Logger

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
	var tc *tls.Config
	if strings.HasPrefix(cfg.URL, "https:") {
		var err error
		if tc, err = cfg.TLS.ClientTLS(); err != nil {
			return nil, fmt.Errorf("%w: agent %q: %v", ErrHTTPAuthConfig, cfg.Name, err)
		}
	}
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:            d.DialContext,
		TLSClientConfig:        tc,
		TLSHandshakeTimeout:    cfg.DialTimeout,
		MaxIdleConns:           cfg.MaxInFlight,
		MaxIdleConnsPerHost:    cfg.MaxInFlight,
		MaxConnsPerHost:        cfg.MaxInFlight,
		IdleConnTimeout:        90 * time.Second,
		MaxResponseHeaderBytes: maxResponseHeader,
		// The denial's body is passed on as the service encoded it.
		DisableCompression: true,
		ForceAttemptHTTP2:  false,
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		Pool: agentmux.NewPool(cfg.Name, "http_auth"),
		cfg:  cfg,
		tr:   tr,
		http: &http.Client{Transport: tr,
			// A redirect is an answer for the client, not one to follow.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		ctx:    ctx,
		cancel: cancel,
		log:    cfg.Logger.With().Str("address", cfg.URL).Logger(),
	}
	c.wg.Add(1)
	go c.maintain()
	return c, nil
}

// probe asks the service once, without a request's headers: any HTTP
// answer (a 401 included) is a service that answers.
func (c *Client) probe() error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.cfg.URL, nil)
	if err != nil {
		return err
	}
	req.Header.Set("User-Agent", userAgent)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	drain(resp.Body)
	return nil
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
	c.wg.Wait()
	c.tr.CloseIdleConnections()
	return err
}

const userAgent = "zentinel-sidecar/0.1 http_auth"

// drain reads what is left of a body (bounded) so that its connection is
// reused, and closes it.
func drain(b io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, b, 64<<10)
	_ = b.Close()
}

// checker makes the subrequests of the client's session.
type checker struct{ c *Client }

// skipRequest are the client headers never sent to the service: the
// subrequest frames itself, asks for no encoding it would have to undo,
// and its hop-by-hop headers are its own.
func skipRequest(name string) bool {
	switch strings.ToLower(name) {
	case "host", "content-length", "transfer-encoding", "accept-encoding", "expect",
		"connection", "keep-alive", "te", "trailer", "upgrade", "proxy-connection", "proxy-authorization":
		return true
	}
	return false
}

// skipResponse are the headers of a denial not passed to the client: the
// proxy frames the response itself.
func skipResponse(name string) bool {
	switch strings.ToLower(name) {
	case "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer",
		"upgrade", "proxy-connection", "date", "server":
		return true
	}
	return false
}

// Check implements authcall.Checker: one subrequest.
func (k checker) Check(ctx context.Context, m *protocol.RequestHeaders, _ []byte, d *protocol.Decision) error {
	c := k.c
	cfg := &c.cfg
	c.count(evChecks)
	method := http.MethodGet
	if cfg.Style == StyleNginx && len(m.Method) > 0 {
		method = string(m.Method)
	}
	req, err := http.NewRequestWithContext(ctx, method, cfg.URL, nil)
	if err != nil {
		return err
	}
	h := req.Header
	for i := range m.Headers {
		name := string(m.Headers[i].Name)
		if skipRequest(name) {
			continue
		}
		ck := http.CanonicalHeaderKey(name)
		if cfg.RequestHeaders != nil && !contains(cfg.RequestHeaders, ck) {
			continue
		}
		h[ck] = append(h[ck], string(m.Headers[i].Value))
	}
	md := &m.Metadata
	host := string(header(m.Headers, "host"))
	switch cfg.Style {
	case StyleNginx:
		h.Set("X-Original-Method", string(m.Method))
		h.Set("X-Original-URI", string(m.URI))
	default:
		proto := "http"
		if len(md.TLSVersion) > 0 {
			proto = "https"
		}
		h.Set("X-Forwarded-Method", string(m.Method))
		h.Set("X-Forwarded-Proto", proto)
		h.Set("X-Forwarded-Host", host)
		h.Set("X-Forwarded-Uri", string(m.URI))
		if len(md.ClientIP) > 0 {
			h.Set("X-Forwarded-For", string(md.ClientIP))
		}
	}
	if h.Get("User-Agent") == "" {
		h.Set("User-Agent", userAgent)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the URL is configuration; the cause is news
		}
		return err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		drain(resp.Body)
		c.count(evOK)
		d.Kind = protocol.DecisionAllow
		k.copyHeaders(m, resp.Header, d)
		return nil
	}
	c.count(evDenied)
	body, truncated, err := readBounded(resp.Body, cfg.MaxBody)
	_ = resp.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the answer's body: %w", err)
	}
	if truncated {
		c.count(evTruncated)
	}
	d.Kind = protocol.DecisionBlock
	d.Status = resp.StatusCode
	d.Body = body
	for name, vals := range resp.Header {
		if skipResponse(name) || (truncated && strings.EqualFold(name, "content-encoding")) {
			continue
		}
		lname := []byte(strings.ToLower(name))
		for _, v := range vals {
			d.BlockHeaders = append(d.BlockHeaders, protocol.Header{Name: lname, Value: []byte(v)})
		}
	}
	return nil
}

// copyHeaders copies the configured headers of a 2xx answer onto the
// upstream request: each configured name (or every client header the
// regex matches) is removed first, then the answer's values added, so
// the upstream never sees a client's own copy of an identity header.
func (k checker) copyHeaders(m *protocol.RequestHeaders, rh http.Header, d *protocol.Decision) {
	cfg := &k.c.cfg
	for _, name := range cfg.ResponseHeaders {
		lname := []byte(strings.ToLower(name))
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: lname})
		for _, v := range rh[name] {
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderAdd, Name: lname, Value: []byte(v)})
		}
	}
	re := cfg.ResponseHeadersRegex
	if re == nil {
		return
	}
	for i := range m.Headers {
		n := m.Headers[i].Name
		if re.Match(n) || re.MatchString(http.CanonicalHeaderKey(string(n))) {
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderRemove, Name: []byte(strings.ToLower(string(n)))})
		}
	}
	for name, vals := range rh {
		if contains(cfg.ResponseHeaders, name) || !re.MatchString(name) || skipResponse(name) {
			continue
		}
		lname := []byte(strings.ToLower(name))
		for _, v := range vals {
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderAdd, Name: lname, Value: []byte(v)})
		}
	}
}

// readBounded reads at most n bytes of b; truncated says there was more.
func readBounded(b io.Reader, n int) (body []byte, truncated bool, err error) {
	body, err = io.ReadAll(io.LimitReader(b, int64(n)+1))
	if len(body) > n {
		return body[:n], true, err
	}
	return body, false, err
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func header(hs protocol.Headers, name string) []byte {
	for i := range hs {
		if strings.EqualFold(string(hs[i].Name), name) {
			return hs[i].Value
		}
	}
	return nil
}
