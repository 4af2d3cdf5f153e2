package config

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Route matching beyond host and path prefix, route actions, per-route
// timeouts and retries, and local rate limits (docs/configuration.md,
// "Route matching and actions").

// StringMatch is one condition on a header or query parameter value.
// Exactly one of Present, Exact, Prefix and Regex is set; Invert negates
// the result.
type StringMatch struct {
	// Name is the header (any case) or query parameter (as sent) name.
	Name string `yaml:"name"`
	// Present matches when a field of the name is there, whatever its
	// value.
	Present bool `yaml:"present"`
	// Exact matches a value equal to it, byte for byte.
	Exact *string `yaml:"exact"`
	// Prefix matches a value that starts with it.
	Prefix string `yaml:"prefix"`
	// Regex matches a value the RE2 expression matches in full (it is
	// anchored: "^(?:regex)$").
	Regex string `yaml:"regex"`
	// Invert matches when the condition does not hold (no field of the
	// name, or none whose value matches).
	Invert bool `yaml:"invert"`
}

// HeaderValue is a header to add or set.
type HeaderValue struct {
	Name  string `yaml:"name"`
	Value string `yaml:"value"`
}

// HeaderOps change a request's or response's headers on a route, without
// an agent, under the rules that bind agents' operations (no hop-by-hop,
// Host, Content-Length or X-Sidecar-* name; RFC 9110 values; Location an
// absolute http(s) URL or a /path). They apply in the order remove, set,
// add.
type HeaderOps struct {
	// Add appends a field (others of the name stay).
	Add []HeaderValue `yaml:"add"`
	// Set replaces every field of the name with one.
	Set []HeaderValue `yaml:"set"`
	// Remove removes every field of each name.
	Remove []string `yaml:"remove"`
}

// Empty reports no operation.
func (h *HeaderOps) Empty() bool { return len(h.Add)+len(h.Set)+len(h.Remove) == 0 }

// RegexRewrite rewrites the path with an RE2 expression: every match of
// Pattern is replaced by Substitution ($1, ${name} expand to groups).
type RegexRewrite struct {
	Pattern      string `yaml:"pattern"`
	Substitution string `yaml:"substitution"`
}

// Rewrite changes the path the upstream gets (the query is kept).
type Rewrite struct {
	// Prefix replaces the part of the path the route's path_prefix (or
	// path) matched.
	Prefix *string `yaml:"prefix"`
	// Regex rewrites the path with a regular expression.
	Regex *RegexRewrite `yaml:"regex"`
}

// DirectResponse answers the route's requests itself, without an
// upstream or agents.
type DirectResponse struct {
	// Status is the response status (100..599 but 101; default 200).
	Status int `yaml:"status"`
	// Body is the response body (at most 64KiB).
	Body string `yaml:"body"`
	// ContentType is the body's Content-Type (default text/plain;
	// charset=utf-8 when there is a body).
	ContentType string `yaml:"content_type"`
}

// Redirect answers the route's requests with a redirect, without an
// upstream or agents. The Location is the request's URL with the parts
// given replaced.
type Redirect struct {
	// HTTPS makes the scheme https (an https upgrade); otherwise the
	// scheme is the request's.
	HTTPS bool `yaml:"https"`
	// Host replaces the host (a host name, optionally with a port).
	Host string `yaml:"host"`
	// Path replaces the whole path.
	Path string `yaml:"path"`
	// PrefixRewrite replaces the part of the path the route's path_prefix
	// (or path) matched.
	PrefixRewrite *string `yaml:"prefix_rewrite"`
	// StripQuery drops the query.
	StripQuery bool `yaml:"strip_query"`
	// Status is 301 (default), 302, 303, 307 or 308.
	Status int `yaml:"status"`
}

// Retry conditions (retry_on).
const (
	RetryConnectFailure = "connect-failure" // no connection could be made (refused, timed out, unreachable)
	RetryRefused        = "refused"         // the connection was refused
	RetryReset          = "reset"           // the connection broke before a response head
	Retry502            = "502"
	Retry503            = "503"
	Retry504            = "504"
	RetryTimeout        = "timeout" // a try timed out waiting for the response head
)

var retryOns = []string{RetryConnectFailure, RetryRefused, RetryReset, Retry502, Retry503, Retry504, RetryTimeout}

// RetryBudget caps the retries in flight on a route: at most Percent of
// the route's requests in flight, and never fewer than MinRetries at
// once, so that retries cannot multiply the load on a failing upstream.
type RetryBudget struct {
	// Percent of the route's active requests that may be retries at once
	// (default 20).
	Percent float64 `yaml:"percent"`
	// MinRetries is the retries allowed at once whatever the percentage
	// (default 3).
	MinRetries int `yaml:"min_retries"`
}

// Retry is a route's retry policy. Only a request that can be sent again
// is retried: one without a body, or whose body nothing consumed yet.
type Retry struct {
	// RetryOn lists the conditions that retry (connect-failure, refused,
	// reset, 502, 503, 504, timeout).
	RetryOn []string `yaml:"retry_on"`
	// NumRetries is the most retries of one request (default 1; at most
	// 10).
	NumRetries int `yaml:"num_retries"`
	// PerTryTimeout bounds each try's wait for the response head (default:
	// the route's upstream_timeout).
	PerTryTimeout time.Duration `yaml:"per_try_timeout"`
	// BackoffBase is the first retry's backoff (default 25ms); each next
	// one doubles, up to BackoffMax (default 10×base), with full jitter.
	BackoffBase time.Duration `yaml:"backoff_base"`
	BackoffMax  time.Duration `yaml:"backoff_max"`
	// Budget caps the retries in flight on the route.
	Budget RetryBudget `yaml:"budget"`
}

// Equal reports whether r and o are the same policy.
func (r *Retry) Equal(o *Retry) bool {
	return slices.Equal(r.RetryOn, o.RetryOn) && r.NumRetries == o.NumRetries && r.PerTryTimeout == o.PerTryTimeout &&
		r.BackoffBase == o.BackoffBase && r.BackoffMax == o.BackoffMax && r.Budget == o.Budget
}

// Rate limit keys.
const (
	RateKeyNone       = "none"        // one bucket for the route
	RateKeyClientIP   = "client_ip"   // a bucket per client address
	RateKeyHeader     = "header"      // a bucket per value of a header
	RateKeyMethodPath = "method_path" // a bucket per method and path
)

// Rate limit stages.
const (
	RateBeforeAgents = "before_agents"
	RateAfterAgents  = "after_agents"
)

// When a rate limit's RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers) are sent.
const (
	// RateHeadersOnLimit: on the 429 of a refused request only (as
	// Envoy's rate limit filters without enable_x_ratelimit_headers).
	RateHeadersOnLimit = "on_limit"
	// RateHeadersAlways: on every response, an allowed request's with
	// the quota left.
	RateHeadersAlways = "always"
)

// RateLimit is a local token bucket: Requests per Period on average, at
// most Burst at once, per key. Past it a request is answered 429 with
// Retry-After, RateLimit-Policy and RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers).
type RateLimit struct {
	// Requests per Period refill the bucket (required).
	Requests int `yaml:"requests"`
	// Period of the refill (default 1s).
	Period time.Duration `yaml:"period"`
	// Burst is the bucket's size (default Requests).
	Burst int `yaml:"burst"`
	// Key is none (default), client_ip, header or method_path.
	Key string `yaml:"key"`
	// Header names the header of key: header. A request without it
	// shares one bucket.
	Header string `yaml:"header"`
	// MaxKeys bounds the keys tracked at once (default 100000); past it
	// the least recently used key's bucket is dropped (it starts full
	// when it comes back).
	MaxKeys int `yaml:"max_keys"`
	// Stage is before_agents (default) or after_agents.
	Stage string `yaml:"stage"`
	// Headers is on_limit (default: RateLimit-Policy and RateLimit on the
	// 429 only) or always (also on the responses to allowed requests,
	// with the bucket's remaining requests and the seconds until it is
	// full again).
	Headers string `yaml:"headers"`
}

// Failure modes of the rate limit service.
const (
	RateLimitFailAllow = "allow"
	RateLimitFailDeny  = "deny"
)

// RateLimitService is an Envoy rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) that
// routes with global_rate_limit ask.
type RateLimitService struct {
	// Address is host:port of the service.
	Address string `yaml:"address"`
	// TLS secures the connection (nil: gRPC without TLS, for a loopback
	// or mesh-local service).
	TLS *RateLimitServiceTLS `yaml:"tls"`
	// Domain is the request's domain (required).
	Domain string `yaml:"domain"`
	// Timeout bounds each call (default 20ms).
	Timeout time.Duration `yaml:"timeout"`
	// FailureMode is allow (default: an unanswered call lets the request
	// through) or deny (500, as Envoy's failure_mode_deny).
	FailureMode string `yaml:"failure_mode"`
}

// RateLimitServiceTLS connects to the rate limit service over TLS
// (rate_limit_service.tls); its files are read when the connection is
// made (at start, and at a reload that changes rate_limit_service).
type RateLimitServiceTLS struct {
	// CAFile is a PEM bundle of the CAs the service's certificate must
	// chain to (default: the system roots).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a client certificate presented to the
	// service (mTLS; both or neither).
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName is the name checked against the service's certificate
	// (default: the host of the address).
	ServerName string `yaml:"server_name"`
}

// Equal reports whether s and o are the same service settings.
func (s *RateLimitService) Equal(o *RateLimitService) bool {
	a, b := *s, *o
	a.TLS, b.TLS = nil, nil
	if a != b || (s.TLS == nil) != (o.TLS == nil) {
		return false
	}
	return s.TLS == nil || *s.TLS == *o.TLS
}

// DescriptorEntry is one entry of a descriptor, as Envoy's rate limit
// actions make them. Exactly one of its kinds is set.
type DescriptorEntry struct {
	// RemoteAddress: ("remote_address", the client's address, with the
	// rules of a local limit's client_ip).
	RemoteAddress bool `yaml:"remote_address"`
	// RequestHeader: (descriptor_key, the header's value); a request
	// without the header sends no such descriptor.
	RequestHeader string `yaml:"request_header"`
	// GenericKey: (descriptor_key or "generic_key", this value).
	GenericKey string `yaml:"generic_key"`
	// RouteName: ("route_name", the route's name).
	RouteName bool `yaml:"route_name"`
	// DescriptorKey names the entry of request_header (required) and
	// generic_key.
	DescriptorKey string `yaml:"descriptor_key"`
}

// RateLimitDescriptor is one descriptor of a request.
type RateLimitDescriptor struct {
	Entries []DescriptorEntry `yaml:"entries"`
}

// GlobalRateLimit asks the rate limit service about a route's requests.
type GlobalRateLimit struct {
	// Descriptors are sent in one ShouldRateLimit call; OVER_LIMIT on
	// any answers 429.
	Descriptors []RateLimitDescriptor `yaml:"descriptors"`
	// Stage is before_agents (default) or after_agents.
	Stage string `yaml:"stage"`
	// Headers is on_limit (default: RateLimit-Policy and RateLimit on the
	// 429 only) or always (also on the responses to allowed requests,
	// from the service's descriptor statuses, as Envoy's
	// enable_x_ratelimit_headers).
	Headers string `yaml:"headers"`
}

func (v *validator) rateHeaders(p, h string) {
	if h != RateHeadersOnLimit && h != RateHeadersAlways {
		v.failf(p+".headers", "unknown headers %q (want on_limit or always)", h)
	}
}

func (v *validator) rateLimitService() {
	s := v.c.RateLimitService
	if s == nil {
		return
	}
	v.address("rate_limit_service.address", s.Address, false)
	if s.Domain == "" {
		v.failf("rate_limit_service.domain", "domain is required")
	}
	v.positive("rate_limit_service.timeout", s.Timeout)
	if t := s.TLS; t != nil {
		const p = "rate_limit_service.tls"
		if t.CertFile != "" || t.KeyFile != "" {
			v.keyPair(p, t.CertFile, t.KeyFile, false)
		}
		if t.CAFile != "" {
			if _, err := LoadCertPool(t.CAFile); err != nil {
				v.failf(p+".ca_file", "%v", err)
			}
		}
		if t.ServerName == "" && strings.HasPrefix(s.Address, "unix:") {
			v.failf(p+".server_name", "a unix: address over TLS needs server_name")
		}
	}
	if s.FailureMode != RateLimitFailAllow && s.FailureMode != RateLimitFailDeny {
		v.failf("rate_limit_service.failure_mode", "unknown failure mode %q (want allow or deny)", s.FailureMode)
	}
}

func (v *validator) globalRateLimit(p string, g *GlobalRateLimit) {
	if v.c.RateLimitService == nil {
		v.failf(p, "global_rate_limit needs a rate_limit_service")
	}
	if len(g.Descriptors) == 0 {
		v.failf(p+".descriptors", "at least one descriptor is required")
	}
	for i, d := range g.Descriptors {
		dp := fmt.Sprintf("%s.descriptors[%d]", p, i)
		if len(d.Entries) == 0 {
			v.failf(dp+".entries", "at least one entry is required")
		}
		for j, e := range d.Entries {
			ep := fmt.Sprintf("%s.entries[%d]", dp, j)
			n := 0
			for _, set := range []bool{e.RemoteAddress, e.RequestHeader != "", e.GenericKey != "", e.RouteName} {
				if set {
					n++
				}
			}
			if n != 1 {
				v.failf(ep, "exactly one of remote_address, request_header, generic_key and route_name is required")
			}
			if e.RequestHeader != "" && !validToken(e.RequestHeader) {
				v.failf(ep+".request_header", "%q is not a header name", e.RequestHeader)
			}
			if e.RequestHeader != "" && e.DescriptorKey == "" {
				v.failf(ep+".descriptor_key", "request_header needs a descriptor_key")
			}
		}
	}
	if g.Stage != RateBeforeAgents && g.Stage != RateAfterAgents {
		v.failf(p+".stage", "unknown stage %q (want before_agents or after_agents)", g.Stage)
	}
	v.rateHeaders(p, g.Headers)
}

// routeActions counts the actions of r that answer without an upstream.
func (r *Route) localAnswer() bool { return r.DirectResponse != nil || r.Redirect != nil }

// setRouteDefaults fills the defaults of the routing keys of r.
func (r *Route) setRoutingDefaults() {
	if r.DirectResponse != nil && r.DirectResponse.Status == 0 {
		r.DirectResponse.Status = 200
	}
	if r.Redirect != nil && r.Redirect.Status == 0 {
		r.Redirect.Status = 301
	}
	if rt := r.Retry; rt != nil {
		setInt(&rt.NumRetries, 1)
		setDur(&rt.BackoffBase, 25*time.Millisecond)
		setDur(&rt.BackoffMax, 10*rt.BackoffBase)
		if rt.Budget.Percent == 0 {
			rt.Budget.Percent = 20
		}
		setInt(&rt.Budget.MinRetries, 3)
	}
	if rl := r.RateLimit; rl != nil {
		rl.setDefaults()
	}
	if g := r.GlobalRateLimit; g != nil {
		if g.Stage == "" {
			g.Stage = RateBeforeAgents
		}
		if g.Headers == "" {
			g.Headers = RateHeadersOnLimit
		}
	}
}

func (rl *RateLimit) setDefaults() {
	setDur(&rl.Period, time.Second)
	setInt(&rl.Burst, rl.Requests)
	if rl.Key == "" {
		rl.Key = RateKeyNone
	}
	setInt(&rl.MaxKeys, 100000)
	if rl.Stage == "" {
		rl.Stage = RateBeforeAgents
	}
	if rl.Headers == "" {
		rl.Headers = RateHeadersOnLimit
	}
}

// CompileRegex compiles a route's RE2 expression anchored at both ends
// (as Envoy's safe_regex matches the whole value).
func CompileRegex(expr string) (*regexp.Regexp, error) {
	return regexp.Compile("^(?:" + expr + ")$")
}

// maxRegex bounds a route's expressions: RE2 runs in linear time, but
// its program grows with the expression.
const maxRegex = 4096

func (v *validator) regex(path, expr string) {
	if len(expr) > maxRegex {
		v.failf(path, "expression longer than %d bytes", maxRegex)
		return
	}
	if _, err := CompileRegex(expr); err != nil {
		v.failf(path, "invalid RE2 expression: %v", err)
	}
}

// routing checks the matching and action keys of route r at p.
func (v *validator) routing(p string, r *Route) {
	paths := 0
	if r.PathPrefix != "" {
		paths++
	}
	if r.Path != "" {
		paths++
		if !strings.HasPrefix(r.Path, "/") {
			v.failf(p+".path", "%q must start with /", r.Path)
		}
	}
	if r.PathRegex != "" {
		paths++
		v.regex(p+".path_regex", r.PathRegex)
	}
	if paths > 1 {
		v.failf(p+".path", "only one of path_prefix, path and path_regex may be given")
	}
	for j, m := range r.Methods {
		if !validMethod(m) {
			v.failf(fmt.Sprintf("%s.methods[%d]", p, j), "%q is not an HTTP method token", m)
		}
	}
	for j := range r.Headers {
		hp := fmt.Sprintf("%s.headers[%d]", p, j)
		v.stringMatch(hp, &r.Headers[j], true)
	}
	for j := range r.Query {
		v.stringMatch(fmt.Sprintf("%s.query[%d]", p, j), &r.Query[j], false)
	}
	local := r.localAnswer()
	if r.DirectResponse != nil && r.Redirect != nil {
		v.failf(p+".redirect", "a route has either direct_response or redirect, not both")
	}
	if local && r.Upstream != "" {
		v.failf(p+".upstream", "a route with direct_response or redirect has no upstream")
	}
	if local && len(r.Agents) > 0 {
		v.failf(p+".agents", "a route with direct_response or redirect has no agents (it answers before them)")
	}
	if d := r.DirectResponse; d != nil {
		dp := p + ".direct_response"
		if d.Status < 200 || d.Status > 599 {
			v.failf(dp+".status", "%d is not in 200..599", d.Status)
		}
		if len(d.Body) > 64<<10 {
			v.failf(dp+".body", "longer than 64KiB")
		}
		if d.ContentType != "" && !validFieldValue(d.ContentType) {
			v.failf(dp+".content_type", "%q is not a header value", d.ContentType)
		}
	}
	if rd := r.Redirect; rd != nil {
		rp := p + ".redirect"
		switch rd.Status {
		case 301, 302, 303, 307, 308:
		default:
			v.failf(rp+".status", "%d is not 301, 302, 303, 307 or 308", rd.Status)
		}
		if rd.Host != "" && !validHostPort(rd.Host) {
			v.failf(rp+".host", "%q is not a host name", rd.Host)
		}
		if rd.Path != "" && (!strings.HasPrefix(rd.Path, "/") || !validFieldValue(rd.Path) || strings.ContainsAny(rd.Path, " ?#\\")) {
			v.failf(rp+".path", "%q is not a /path", rd.Path)
		}
		if rd.Path != "" && rd.PrefixRewrite != nil {
			v.failf(rp+".prefix_rewrite", "path and prefix_rewrite exclude each other")
		}
		if rd.PrefixRewrite != nil {
			v.rewritePrefix(rp+".prefix_rewrite", *rd.PrefixRewrite, r)
		}
	}
	if rw := r.Rewrite; rw != nil {
		wp := p + ".rewrite"
		if local {
			v.failf(wp, "a route that answers itself forwards nothing to rewrite")
		}
		switch {
		case rw.Prefix != nil && rw.Regex != nil:
			v.failf(wp, "prefix and regex exclude each other")
		case rw.Prefix != nil:
			v.rewritePrefix(wp+".prefix", *rw.Prefix, r)
		case rw.Regex != nil:
			v.regex(wp+".regex.pattern", rw.Regex.Pattern)
			if strings.ContainsAny(rw.Regex.Substitution, "?#") || !validFieldValue(rw.Regex.Substitution) {
				v.failf(wp+".regex.substitution", "%q may not hold '?', '#' or control bytes", rw.Regex.Substitution)
			}
		}
	}
	v.headerOps(p+".request_headers", &r.RequestHeaders)
	v.headerOps(p+".response_headers", &r.ResponseHeaders)
	if r.Timeout < 0 {
		v.failf(p+".timeout", "must not be negative (0: none)")
	}
	if r.UpstreamTimeout < 0 {
		v.failf(p+".upstream_timeout", "must not be negative (0: the upstream's response_timeout)")
	}
	if rt := r.Retry; rt != nil {
		v.retry(p+".retry", rt, local)
	}
	if rl := r.RateLimit; rl != nil {
		v.rateLimit(p+".rate_limit", rl)
	}
	if g := r.GlobalRateLimit; g != nil {
		if local {
			v.failf(p+".global_rate_limit", "a route that answers itself is not limited by the service")
		}
		v.globalRateLimit(p+".global_rate_limit", g)
	}
}

func (v *validator) rewritePrefix(path, prefix string, r *Route) {
	if r.PathRegex != "" {
		v.failf(path, "a prefix rewrite needs a route matched by path_prefix or path")
	}
	if !strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "?# \\") || !validFieldValue(prefix) {
		v.failf(path, "%q is not a /path", prefix)
	}
}

func (v *validator) stringMatch(p string, m *StringMatch, header bool) {
	switch {
	case m.Name == "":
		v.failf(p+".name", "name is required")
	case header && !validToken(m.Name):
		v.failf(p+".name", "%q is not a header name", m.Name)
	case header && strings.EqualFold(m.Name, "host"):
		v.failf(p+".name", "the host is matched by hosts, not headers")
	}
	n := 0
	if m.Present {
		n++
	}
	if m.Exact != nil {
		n++
	}
	if m.Prefix != "" {
		n++
	}
	if m.Regex != "" {
		n++
		v.regex(p+".regex", m.Regex)
	}
	if n != 1 {
		v.failf(p, "exactly one of present, exact, prefix and regex is required")
	}
}

// maxHeaderOpsRoute bounds a route's header operations.
const maxHeaderOpsRoute = 64

func (v *validator) headerOps(p string, h *HeaderOps) {
	if n := len(h.Add) + len(h.Set) + len(h.Remove); n > maxHeaderOpsRoute {
		v.failf(p, "%d operations (at most %d)", n, maxHeaderOpsRoute)
	}
	check := func(kp, name string) {
		switch {
		case !validToken(name):
			v.failf(kp, "%q is not a header name", name)
		default:
			if why := refusedName(strings.ToLower(name)); why != "" {
				v.failf(kp, "%q is refused: %s", name, why)
			}
		}
	}
	for k, hv := range h.Add {
		check(fmt.Sprintf("%s.add[%d].name", p, k), hv.Name)
		v.headerValue(fmt.Sprintf("%s.add[%d].value", p, k), hv)
	}
	for k, hv := range h.Set {
		check(fmt.Sprintf("%s.set[%d].name", p, k), hv.Name)
		v.headerValue(fmt.Sprintf("%s.set[%d].value", p, k), hv)
	}
	for k, name := range h.Remove {
		check(fmt.Sprintf("%s.remove[%d]", p, k), name)
	}
}

func (v *validator) headerValue(p string, hv HeaderValue) {
	if !validFieldValue(hv.Value) || len(hv.Value) > 16<<10 {
		v.failf(p, "not an RFC 9110 field value of at most 16KiB")
	}
	if strings.EqualFold(hv.Name, "location") && !(strings.HasPrefix(hv.Value, "/") && !strings.HasPrefix(hv.Value, "//") ||
		strings.HasPrefix(strings.ToLower(hv.Value), "http://") || strings.HasPrefix(strings.ToLower(hv.Value), "https://")) {
		v.failf(p, "a Location must be an absolute http(s) URL or a /path")
	}
}

// refusedName is the rule the exchange applies to every agent header
// operation (lower-case name): why it is refused, or "".
func refusedName(name string) string {
	switch name {
	case "connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
		"proxy-authenticate", "proxy-authorization":
		return "hop-by-hop header"
	case "host":
		return "host header"
	case "content-length":
		return "content-length header"
	}
	if strings.HasPrefix(name, "x-sidecar-") {
		return "sidecar marker header"
	}
	if strings.HasPrefix(name, "proxy-") {
		return "hop-by-hop header"
	}
	return ""
}

func (v *validator) retry(p string, rt *Retry, local bool) {
	if local {
		v.failf(p, "a route that answers itself has nothing to retry")
	}
	if len(rt.RetryOn) == 0 {
		v.failf(p+".retry_on", "at least one condition is required (%s)", strings.Join(retryOns, ", "))
	}
	for j, c := range rt.RetryOn {
		if !slices.Contains(retryOns, c) {
			v.failf(fmt.Sprintf("%s.retry_on[%d]", p, j), "unknown condition %q (want %s)", c, strings.Join(retryOns, ", "))
		}
	}
	if rt.NumRetries < 1 || rt.NumRetries > 10 {
		v.failf(p+".num_retries", "%d is not in 1..10", rt.NumRetries)
	}
	if rt.PerTryTimeout < 0 {
		v.failf(p+".per_try_timeout", "must not be negative")
	}
	v.positive(p+".backoff_base", rt.BackoffBase)
	if rt.BackoffMax < rt.BackoffBase {
		v.failf(p+".backoff_max", "%v is below backoff_base (%v)", rt.BackoffMax, rt.BackoffBase)
	}
	if rt.Budget.Percent <= 0 || rt.Budget.Percent > 100 {
		v.failf(p+".budget.percent", "%v is not in (0, 100]", rt.Budget.Percent)
	}
	if rt.Budget.MinRetries < 0 {
		v.failf(p+".budget.min_retries", "must not be negative")
	}
}

// maxRateKeys bounds a rate limit's tracked keys (each costs ~100 bytes).
const maxRateKeys = 10_000_000

func (v *validator) rateLimit(p string, rl *RateLimit) {
	if rl.Requests < 1 {
		v.failf(p+".requests", "must be at least 1")
	}
	v.positive(p+".period", rl.Period)
	if rl.Period > 0 && rl.Period < time.Millisecond {
		v.failf(p+".period", "%v is below 1ms", rl.Period)
	}
	if rl.Burst < 1 {
		v.failf(p+".burst", "must be at least 1")
	}
	switch rl.Key {
	case RateKeyNone, RateKeyClientIP, RateKeyMethodPath:
		if rl.Header != "" {
			v.failf(p+".header", "header is for key: header")
		}
	case RateKeyHeader:
		if !validToken(rl.Header) {
			v.failf(p+".header", "key: header needs a header name")
		}
	default:
		v.failf(p+".key", "unknown key %q (want none, client_ip, header or method_path)", rl.Key)
	}
	if rl.MaxKeys < 1 || rl.MaxKeys > maxRateKeys {
		v.failf(p+".max_keys", "%d is not in 1..%d", rl.MaxKeys, maxRateKeys)
	}
	if rl.Stage != RateBeforeAgents && rl.Stage != RateAfterAgents {
		v.failf(p+".stage", "unknown stage %q (want before_agents or after_agents)", rl.Stage)
	}
	v.rateHeaders(p, rl.Headers)
}

func validMethod(m string) bool { return validToken(m) }

// validFieldValue accepts visible ASCII, spaces and tabs, without
// leading or trailing whitespace.
func validFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '\t' || c >= 0x20 && c != 0x7f {
			continue
		}
		return false
	}
	return strings.TrimSpace(s) == s
}

// matchKey is what makes two routes' conditions identical.
func (r *Route) matchKey() string {
	var b strings.Builder
	fmt.Fprintf(&b, "p=%q e=%q x=%q m=%q", r.PathPrefix, r.Path, r.PathRegex, sortedUpper(r.Methods))
	for _, h := range r.Headers {
		fmt.Fprintf(&b, " h=%s", h.key(true))
	}
	for _, q := range r.Query {
		fmt.Fprintf(&b, " q=%s", q.key(false))
	}
	return b.String()
}

func (m *StringMatch) key(fold bool) string {
	name := m.Name
	if fold {
		name = strings.ToLower(name)
	}
	exact := "<nil>"
	if m.Exact != nil {
		exact = *m.Exact
	}
	return fmt.Sprintf("%q/%v/%q/%q/%q/%v", name, m.Present, exact, m.Prefix, m.Regex, m.Invert)
}

func sortedUpper(ms []string) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = strings.ToUpper(m)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// extraConditions reports conditions beyond host and path.
func (r *Route) extraConditions() bool {
	return len(r.Methods)+len(r.Headers)+len(r.Query) > 0
}

// pathRank is a route's place in the match order among the routes of
// one host: exact paths first, then regular expressions, then prefixes,
// longest first (docs/configuration.md). Routes of equal rank keep their
// order in the file.
func (r *Route) pathRank() (kind, length int) {
	switch {
	case r.Path != "":
		return 0, 0
	case r.PathRegex != "":
		return 1, 0
	}
	return 2, -len(r.PathPrefix)
}

// shadows reports whether every request route b matches is matched by
// route a, which comes before b in the match order of a host: the
// same path condition or a covering one, and a's other conditions a
// subset of b's.
func (a *Route) shadows(b *Route) bool {
	switch {
	case a.Path != "":
		if b.Path != a.Path {
			return false
		}
	case a.PathRegex != "":
		if b.PathRegex != a.PathRegex {
			return false
		}
	default:
		switch {
		case b.Path != "":
			if !strings.HasPrefix(b.Path, a.PathPrefix) {
				return false
			}
		case b.PathRegex != "":
			if a.PathPrefix != "/" {
				return false
			}
		default:
			if !strings.HasPrefix(b.PathPrefix, a.PathPrefix) {
				return false
			}
		}
	}
	if len(a.Methods) > 0 {
		if len(b.Methods) == 0 {
			return false
		}
		am := sortedUpper(a.Methods)
		for _, m := range sortedUpper(b.Methods) {
			if !slices.Contains(am, m) {
				return false
			}
		}
	}
	subset := func(as, bs []StringMatch, fold bool) bool {
		for i := range as {
			k := as[i].key(fold)
			found := false
			for j := range bs {
				if bs[j].key(fold) == k {
					found = true
					break
				}
			}
			if !found {
				return false
			}
		}
		return true
	}
	return subset(a.Headers, b.Headers, true) && subset(a.Query, b.Query, false)
}

// routeWarnings warns about routes no request can reach: every host of
// the route is a host of an earlier route in the match order whose
// conditions cover the route's.
func (c *Config) routeWarnings() []Warning {
	var out []Warning
	hostsOf := func(r *Route) []string {
		if len(r.Hosts) == 0 {
			return []string{"*"}
		}
		hs := make([]string, len(r.Hosts))
		for i, h := range r.Hosts {
			hs[i] = CanonicalHost(h)
		}
		return hs
	}
	before := func(i, j int) bool { // i before j in the match order
		ki, li := c.Routes[i].pathRank()
		kj, lj := c.Routes[j].pathRank()
		if ki != kj {
			return ki < kj
		}
		if li != lj {
			return li < lj
		}
		return i < j
	}
	for j := range c.Routes {
		b := &c.Routes[j]
		hosts := hostsOf(b)
		var by []string
		for _, h := range hosts {
			found := ""
			for i := range c.Routes {
				if i == j || !before(i, j) || !slices.Contains(hostsOf(&c.Routes[i]), h) || !c.Routes[i].shadows(b) {
					continue
				}
				found = fmt.Sprintf("routes[%d] (%q, line %d)", i, c.Routes[i].Name, c.lineOf(fmt.Sprintf("routes[%d]", i)))
				break
			}
			if found == "" {
				by = nil
				break
			}
			by = append(by, found)
		}
		if len(by) > 0 {
			out = append(out, c.WarnAt(fmt.Sprintf("routes[%d]", j),
				"route %q is unreachable: every request it matches is matched first by %s", b.Name, strings.Join(slices.Compact(by), ", ")))
		}
	}
	return out
}
