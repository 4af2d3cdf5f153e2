package config

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Validate checks the whole configuration and returns the first problem
// as an *Error naming the key (and its line when the config came from a
// file). Call SetDefaults first.
func (c *Config) Validate() error {
	v := validator{c: c}
	v.listeners()
	v.upstreams()
	v.agents()
	v.rateLimitService()
	v.routes()
	v.logging()
	v.tracing()
	v.ops()
	v.tls()
	return v.err
}

type validator struct {
	c   *Config
	err error
}

func (v *validator) failf(path, format string, args ...any) {
	if v.err != nil {
		return
	}
	v.err = &Error{Line: v.c.lineOf(path), Path: path, Msg: fmt.Sprintf(format, args...), kind: ErrConfigInvalid}
}

// lineOf is the line of path, or of its nearest parent present in the
// file (a defaulted key has no line of its own).
func (c *Config) lineOf(path string) int {
	for path != "" {
		if l, ok := c.lines[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

func (v *validator) listeners() {
	if len(v.c.Listeners) == 0 {
		v.failf("listeners", "at least one listener is required")
		return
	}
	names := map[string]string{}
	addrs := map[string]string{}
	for i := range v.c.Listeners {
		l := &v.c.Listeners[i]
		p := fmt.Sprintf("listeners[%d]", i)
		v.name(p+".name", l.Name, names, "listener")
		v.address(p+".address", l.Address, true)
		if prev, ok := addrs[l.Address]; ok && l.Address != "" {
			v.failf(p+".address", "address %q is also used by %s", l.Address, prev)
		}
		addrs[l.Address] = p
		v.positive(p+".read_timeout", l.ReadTimeout)
		v.positive(p+".idle_timeout", l.IdleTimeout)
		v.positive(p+".body_timeout", l.BodyTimeout)
		v.positive(p+".disconnect_check", l.DisconnectCheck)
		v.bufSize(p+".read_buffer_size", l.ReadBufferSize)
		v.bufSize(p+".write_buffer_size", l.WriteBufferSize)
		if l.MaxConnections < 0 {
			v.failf(p+".max_connections", "must not be negative (0: what the file descriptor limit allows)")
		}
		v.positive(p+".tunnel_idle_timeout", l.TunnelIdleTimeout)
		if l.MaxTunnels < 1 {
			v.failf(p+".max_tunnels", "must be at least 1")
		}
		if l.MaxRequestBody < 0 {
			v.failf(p+".max_request_body", "must not be negative")
		}
		v.positive(p+".lingering_timeout", l.LingeringTimeout)
		if l.MaxLingeringBytes < 1 {
			v.failf(p+".max_lingering_bytes", "must be positive")
		}
		if l.BodyMinRate != nil && *l.BodyMinRate < 0 {
			v.failf(p+".body_min_rate", "must not be negative (0: none)")
		}
		if l.RateLimit != nil {
			v.rateLimit(p+".rate_limit", l.RateLimit)
			if l.RateLimit.Stage != RateBeforeAgents {
				v.failf(p+".rate_limit.stage", "a listener's limit is checked before routing: before_agents only")
			}
		}
		v.listenerProtocols(p, l)
	}
}

// listenerProtocols checks a listener's protocols and HTTP/2 limits.
func (v *validator) listenerProtocols(p string, l *Listener) {
	if len(l.Protocols) == 0 {
		v.failf(p+".protocols", "at least one protocol is required (http1, h2, h2c)")
	}
	seen := map[string]bool{}
	for i, proto := range l.Protocols {
		pp := fmt.Sprintf("%s.protocols[%d]", p, i)
		switch {
		case proto != ProtoHTTP1 && proto != ProtoH2 && proto != ProtoH2C:
			v.failf(pp, "unknown protocol %q (want http1, h2 or h2c)", proto)
		case seen[proto]:
			v.failf(pp, "%q is listed twice", proto)
		case proto == ProtoH2 && l.TLS == nil:
			v.failf(pp, "h2 needs tls (cleartext HTTP/2 is h2c)")
		case proto == ProtoH2C && l.TLS != nil:
			v.failf(pp, "h2c is cleartext; over tls HTTP/2 is h2")
		}
		seen[proto] = true
	}
	h := &l.HTTP2
	if h.MaxConcurrentStreams < 1 || h.MaxConcurrentStreams > 1<<20 {
		v.failf(p+".http2.max_concurrent_streams", "%d is not in 1..1048576", h.MaxConcurrentStreams)
	}
	if h.MaxHeaderListSize < 1<<10 || h.MaxHeaderListSize > MaxBufferSize {
		v.failf(p+".http2.max_header_list_size", "%s is not in 1KiB..1MiB", h.MaxHeaderListSize)
	}
	if h.MaxReadFrameSize < 16<<10 || h.MaxReadFrameSize > 1<<24-1 {
		v.failf(p+".http2.max_read_frame_size", "%s is not in 16KiB..16MiB-1", h.MaxReadFrameSize)
	}
}

func (v *validator) upstreams() {
	names := map[string]string{}
	for i := range v.c.Upstreams {
		u := &v.c.Upstreams[i]
		p := fmt.Sprintf("upstreams[%d]", i)
		v.name(p+".name", u.Name, names, "upstream")
		v.upstreamEndpoints(p, u)
		v.positive(p+".connect_timeout", u.ConnectTimeout)
		v.positive(p+".response_timeout", u.ResponseTimeout)
		v.positive(p+".idle_timeout", u.IdleTimeout)
		v.positive(p+".max_conn_wait", u.MaxConnWait)
		v.positive(p+".keepalive", u.KeepAlive)
		v.bufSize(p+".read_buffer_size", u.ReadBufferSize)
		v.bufSize(p+".write_buffer_size", u.WriteBufferSize)
		if u.MaxConns < 1 {
			v.failf(p+".max_conns", "must be at least 1")
		}
		switch u.Protocol {
		case ProtoHTTP1:
		case ProtoH2:
			if u.TLS == nil {
				v.failf(p+".protocol", "h2 needs tls (cleartext HTTP/2 is h2c)")
			}
		case ProtoH2C:
			if u.TLS != nil {
				v.failf(p+".protocol", "h2c is cleartext; over tls HTTP/2 is h2")
			}
		default:
			v.failf(p+".protocol", "unknown protocol %q (want http1, h2 or h2c)", u.Protocol)
		}
	}
}

func (v *validator) agents() {
	names := map[string]string{}
	for i := range v.c.Agents {
		a := &v.c.Agents[i]
		p := fmt.Sprintf("agents[%d]", i)
		v.name(p+".name", a.Name, names, "agent")
		switch a.Transport {
		case TransportUDS, TransportGRPC, TransportReverse, TransportExtProc, TransportExtAuthz, TransportHTTPAuth:
		case "":
			v.failf(p+".transport", "transport is required (uds, grpc, reverse, ext_proc, ext_authz or http_auth)")
		default:
			v.failf(p+".transport", "unknown transport %q (want uds, grpc, reverse, ext_proc, ext_authz or http_auth)", a.Transport)
		}
		switch {
		case a.Address == "":
			v.failf(p+".address", "address is required")
		case a.Transport == TransportUDS && len(a.Address) > 107:
			v.failf(p+".address", "socket path longer than 107 bytes")
		case a.Transport == TransportGRPC || a.Transport == TransportReverse || a.Transport == TransportExtProc || a.Transport == TransportExtAuthz:
			v.address(p+".address", a.Address, a.Transport == TransportReverse)
		case a.Transport == TransportHTTPAuth:
			v.authURL(p+".address", a.Address)
		}
		if a.Conns < 1 || a.Conns > 64 {
			v.failf(p+".conns", "%d is not in 1..64", a.Conns)
		}
		if a.MaxInFlight < 1 {
			v.failf(p+".max_in_flight", "must be at least 1")
		}
		if a.MaxQueue < 0 {
			v.failf(p+".max_queue", "must not be negative")
		}
		if a.MaxPendingBytes < 64<<10 || a.MaxPendingBytes > 256<<20 {
			v.failf(p+".max_pending_bytes", "%s is not in 64KiB..256MiB", a.MaxPendingBytes)
		}
		if a.PayloadEncoding != EncodingAuto && a.PayloadEncoding != EncodingJSON {
			v.failf(p+".payload_encoding", "%q is not auto or json", a.PayloadEncoding)
		}
		v.positive(p+".timeouts.connect", a.Timeouts.Connect)
		v.positive(p+".timeouts.handshake", a.Timeouts.Handshake)
		v.positive(p+".timeouts.message", a.Timeouts.Message)
		v.positive(p+".timeouts.request", a.Timeouts.Request)
		v.positive(p+".timeouts.frame", a.Timeouts.Frame)
		if a.Timeouts.Frame > time.Minute {
			v.failf(p+".timeouts.frame", "%v is above 1m: a stalled frame holds every request on the connection", a.Timeouts.Frame)
		}
		v.limits(p+".limits", &a.Limits)
		v.failureMode(p+".failure_mode", a.FailureMode, false)
		if a.FailureStatus != 0 && (a.FailureStatus < 400 || a.FailureStatus > 599) {
			// An agent's failure is never a success nor a redirect.
			v.failf(p+".failure_status", "%d is not in 400..599", a.FailureStatus)
		}
		v.body(p+".request_body", &a.RequestBody, false)
		v.body(p+".response_body", &a.ResponseBody, false)
		v.agentPolicy(p, a)
	}
}

func (v *validator) routes() {
	if len(v.c.Routes) == 0 {
		v.failf("routes", "at least one route is required")
		return
	}
	names := map[string]string{}
	type key struct{ host, match string }
	claimed := map[key]string{}
	for i := range v.c.Routes {
		r := &v.c.Routes[i]
		p := fmt.Sprintf("routes[%d]", i)
		v.name(p+".name", r.Name, names, "route")
		switch {
		case r.Upstream == "" && r.localAnswer():
		case r.Upstream == "":
			v.failf(p+".upstream", "upstream is required")
		case v.c.Upstream(r.Upstream) == nil:
			v.failf(p+".upstream", "unknown upstream %q", r.Upstream)
		}
		if r.PathPrefix != "" && !strings.HasPrefix(r.PathPrefix, "/") {
			v.failf(p+".path_prefix", "%q must start with /", r.PathPrefix)
		}
		v.routing(p, r)
		switch r.HostHeader {
		case HostPreserve, HostUpstream:
		default:
			if !validHostPort(r.HostHeader) {
				v.failf(p+".host_header", "%q is not preserve, upstream or a host name", r.HostHeader)
			}
		}
		hosts := r.Hosts
		if len(hosts) == 0 {
			hosts = []string{"*"}
		}
		for j, h := range hosts {
			hp := fmt.Sprintf("%s.hosts[%d]", p, j)
			if !validHostPattern(h) {
				v.failf(hp, "%q is not a host name, *.domain or *", h)
				continue
			}
			k := key{CanonicalHost(h), r.matchKey()}
			if prev, ok := claimed[k]; ok {
				if r.PathPrefix != "" && !r.extraConditions() {
					v.failf(hp, "host %q with path_prefix %q is already routed by %s", h, r.PathPrefix, prev)
				} else {
					v.failf(hp, "host %q with the same conditions is already routed by %s", h, prev)
				}
			}
			claimed[k] = p
		}
		seen := map[string]int{}
		for j := range r.Agents {
			ra := &r.Agents[j]
			ap := fmt.Sprintf("%s.agents[%d]", p, j)
			switch {
			case ra.Name == "":
				v.failf(ap, "agent name is required")
			case v.c.Agent(ra.Name) == nil:
				v.failf(ap, "unknown agent %q", ra.Name)
			}
			if prev, ok := seen[ra.Name]; ok && ra.Name != "" {
				v.failf(ap, "agent %q is already on this route at agents[%d]", ra.Name, prev)
			}
			seen[ra.Name] = j
			v.failureMode(ap+".failure_mode", ra.FailureMode, true)
			if ra.Timeout < 0 {
				v.failf(ap+".timeout", "must not be negative")
			}
			if ra.RequestBody != nil {
				v.body(ap+".request_body", ra.RequestBody, true)
			}
			if ra.ResponseBody != nil {
				v.body(ap+".response_body", ra.ResponseBody, true)
			}
			if ra.ExtAuthz != nil {
				v.routeExtAuthz(ap+".ext_authz", ra)
			}
		}
	}
}

// routeExtAuthz checks a route's ext_authz settings for agent ra.
func (v *validator) routeExtAuthz(p string, ra *RouteAgent) {
	if a := v.c.Agent(ra.Name); a != nil && a.Transport != TransportExtAuthz {
		v.failf(p, "agent %q is of transport %s: ext_authz settings are for ext_authz agents", ra.Name, a.Transport)
		return
	}
	ext := ra.ExtAuthz.ContextExtensions
	if len(ext) > MaxRouteContextExtensions {
		v.failf(p+".context_extensions", "%d entries (at most %d)", len(ext), MaxRouteContextExtensions)
	}
	if _, empty := ext[""]; empty {
		v.failf(p+".context_extensions", "an empty key")
	}
}

func (v *validator) logging() {
	switch v.c.Logging.Level {
	case "trace", "debug", "info", "warn", "error", "disabled":
	default:
		v.failf("logging.level", "unknown level %q (want trace, debug, info, warn, error or disabled)", v.c.Logging.Level)
	}
	switch v.c.Logging.Format {
	case "json", "console":
	default:
		v.failf("logging.format", "unknown format %q (want json or console)", v.c.Logging.Format)
	}
}

func (v *validator) name(path, name string, seen map[string]string, what string) {
	switch {
	case name == "":
		v.failf(path, "%s name is required", what)
	case !validName(name):
		v.failf(path, "%s name %q may only contain letters, digits, '.', '_' and '-' (at most 64)", what, name)
	default:
		if prev, ok := seen[name]; ok {
			v.failf(path, "duplicate %s name %q (also %s)", what, name, prev)
		}
		seen[name] = strings.TrimSuffix(path, ".name")
	}
}

// authURL checks an http_auth agent's address: an absolute http or
// https URL with a host, without credentials or a fragment.
func (v *validator) authURL(path, addr string) {
	u, err := url.Parse(addr)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https"):
		v.failf(path, "%q is not an http:// or https:// URL", addr)
	case u.Host == "" || u.Hostname() == "":
		v.failf(path, "%q has no host", addr)
	case u.User != nil:
		v.failf(path, "credentials in the URL are not accepted (they would be logged)")
	case u.Fragment != "":
		v.failf(path, "%q has a fragment", addr)
	}
}

func (v *validator) address(path, addr string, listen bool) {
	if addr == "" {
		v.failf(path, "address is required")
		return
	}
	if p, ok := strings.CutPrefix(addr, "unix:"); ok {
		if p == "" || len(p) > 107 {
			v.failf(path, "unix socket path must be 1..107 bytes")
		}
		return
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		v.failf(path, "%q is not host:port or unix:/path", addr)
		return
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 || (n == 0 && !listen) {
		v.failf(path, "invalid port %q", port)
		return
	}
	if host == "" && !listen {
		v.failf(path, "host is required")
	}
}

// Upper bounds of the agent limits: beyond them a limit protects nothing.
const (
	maxHeaderOps   = 100000
	maxHeaderBytes = 16 << 20
)

func (v *validator) limits(path string, l *AgentLimits) {
	if l.HeaderOps < 1 || l.HeaderOps > maxHeaderOps {
		v.failf(path+".header_ops", "%d is not in 1..%d", l.HeaderOps, maxHeaderOps)
	}
	for _, f := range []struct {
		key string
		s   Size
	}{{"header_bytes", l.HeaderBytes}, {"header_value", l.HeaderValue}, {"header_block", l.HeaderBlock}} {
		if f.s < 1 || f.s > maxHeaderBytes {
			v.failf(path+"."+f.key, "%s is not in 1B..16MiB", f.s)
		}
	}
}

func (v *validator) positive(path string, d time.Duration) {
	if d <= 0 {
		v.failf(path, "must be positive")
	}
}

func (v *validator) bufSize(path string, s Size) {
	if s < 4<<10 || s > MaxBufferSize {
		v.failf(path, "%s is not in 4KiB..1MiB", s)
	}
}

func (v *validator) failureMode(path, m string, optional bool) {
	switch m {
	case FailOpen, FailClosed:
	case "":
		if !optional {
			v.failf(path, "failure_mode is required (open or closed)")
		}
	default:
		v.failf(path, "unknown failure mode %q (want open or closed)", m)
	}
}

func (v *validator) body(path string, b *BodyPolicy, partial bool) {
	switch b.Mode {
	case BodyAuto, BodyNone, BodyBuffered, BodyStreaming:
	case "":
		if !partial {
			v.failf(path+".mode", "mode is required")
		}
	default:
		v.failf(path+".mode", "unknown body mode %q (want auto, none, buffered or streaming)", b.Mode)
	}
	if !(partial && b.Limit == 0) && (b.Limit < 1 || b.Limit > MaxBodyLimit) {
		v.failf(path+".limit", "%s is not in 1..%s", b.Limit, Size(MaxBodyLimit))
	}
	switch b.OverLimit {
	case OverLimitReject, OverLimitSkip, OverLimitPrefix, OverLimitStream:
	case "":
		if !partial {
			v.failf(path+".over_limit", "over_limit is required")
		}
	default:
		v.failf(path+".over_limit", "unknown action %q (want reject, skip, prefix or stream)", b.OverLimit)
	}
	if !(partial && b.ChunkSize == 0) && (b.ChunkSize < MinChunkSize || b.ChunkSize > MaxChunkSize) {
		v.failf(path+".chunk_size", "%s is not in %s..%s", b.ChunkSize, Size(MinChunkSize), Size(MaxChunkSize))
	}
}

func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// validHostPattern accepts "*", "*.example.com" and "example.com", the
// names with one trailing dot too (their absolute form). It refuses what
// a request's Host may not be (an empty label, a percent-escape, bytes
// outside letters, digits, '-' and '_'), so no route waits for a host no
// request can name.
func validHostPattern(h string) bool {
	if h == "*" {
		return true
	}
	h = strings.TrimSuffix(h, ".")
	if rest, ok := strings.CutPrefix(h, "*."); ok {
		return validHostname(rest)
	}
	return validHostname(h)
}

// CanonicalHost is a route host pattern in the form requests are matched
// in: lower case, one trailing dot removed ("Admin.Example." routes
// admin.example, as a request's Host is canonicalised the same way).
func CanonicalHost(h string) string {
	if h != "*" {
		h = strings.TrimSuffix(h, ".")
	}
	return strings.ToLower(h)
}

func validHostname(h string) bool {
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if len(label) == 0 || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// validHostPort accepts a host name or IP with an optional port.
func validHostPort(s string) bool {
	if s == "" {
		return false
	}
	host := s
	if h, port, err := net.SplitHostPort(s); err == nil {
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return false
		}
		host = h
	}
	if net.ParseIP(host) != nil {
		return true
	}
	return validHostname(host)
}
