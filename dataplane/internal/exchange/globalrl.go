package exchange

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/redial"
	"github.com/zentinelproxy/sidecar/protocol"
)

// Global rate limiting over an Envoy rate limit service
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit). A route
// with global_rate_limit sends the service its descriptors, built as
// Envoy's rate limit actions build them (remote_address, request_headers,
// generic_key; route_name adds the route), in one call bounded by the
// service's timeout. OVER_LIMIT answers 429 with Retry-After (the
// longest duration_until_reset of the descriptors over their limit, at
// least 1 s), RateLimit and RateLimit-Policy when the service says the
// limit, and the service's response_headers_to_add; OK applies its
// request_headers_to_add to the upstream request and its
// response_headers_to_add to the client's response (with headers:
// always, RateLimit-Policy and RateLimit from its statuses too). Both
// sets of headers pass the rules of agents' header operations. A call
// that fails (an error, a timeout, the service answering UNKNOWN) lets
// the request through (failure_mode: allow) or answers 500 (deny), and
// is counted.
// The call allocates (gRPC): routes without global_rate_limit pay
// nothing. The connection is plaintext or, with rate_limit_service.tls,
// TLS or mTLS with the agents' gRPC transports' credentials and options
// (internal/grpcclient).

// rlService is the connection to the rate limit service; one per
// configuration, kept across reloads that keep its settings.
type rlService struct {
	cfg    config.RateLimitService
	conn   *grpc.ClientConn
	client rlsv3.RateLimitServiceClient
}

// rlsMaxMessage caps the service's messages both ways: descriptors and
// statuses are a few hundred bytes; gRPC's default of 4 MiB is room
// enough for any service that adds headers.
const rlsMaxMessage = 4 << 20

func newRLService(c *config.RateLimitService) (*rlService, error) {
	// The options of the agents' gRPC transports: credentials read now,
	// reconnects backing off 50ms..5s, no transparent retries (a call
	// has its timeout of a few milliseconds).
	var t grpcclient.TLSConfig
	if c.TLS != nil {
		t = grpcclient.TLSConfig{Enabled: true, CAFile: c.TLS.CAFile, CertFile: c.TLS.CertFile,
			KeyFile: c.TLS.KeyFile, ServerName: c.TLS.ServerName}
	}
	creds, err := grpcclient.Credentials(&t)
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	opts := grpcclient.DialOptionsWith(creds, rlsMaxMessage, redial.DefaultConnectTimeout+redial.DefaultHandshakeTimeout,
		redial.DefaultMin, redial.DefaultMax, "zentinel-sidecar/0.1 ratelimit")
	conn, err := grpc.NewClient(c.Address, opts...)
	if err != nil {
		return nil, err
	}
	return &rlService{cfg: *c, conn: conn, client: rlsv3.NewRateLimitServiceClient(conn)}, nil
}

func (s *rlService) close() {
	if s != nil {
		_ = s.conn.Close()
	}
}

// Descriptor entry kinds.
const (
	entRemote uint8 = iota
	entHeader
	entGeneric
	entRoute
)

type descEntry struct {
	kind       uint8
	key, value string
	header     []byte
}

// globalLimit is a route's global_rate_limit.
type globalLimit struct {
	descs  [][]descEntry
	after  bool
	always bool // headers: always
}

func newGlobalLimit(g *config.GlobalRateLimit) *globalLimit {
	gl := &globalLimit{after: g.Stage == config.RateAfterAgents, always: g.Headers == config.RateHeadersAlways}
	for _, d := range g.Descriptors {
		var es []descEntry
		for _, e := range d.Entries {
			switch {
			case e.RemoteAddress:
				es = append(es, descEntry{kind: entRemote, key: "remote_address"})
			case e.RequestHeader != "":
				es = append(es, descEntry{kind: entHeader, key: e.DescriptorKey, header: []byte(e.RequestHeader)})
			case e.GenericKey != "":
				k := e.DescriptorKey
				if k == "" {
					k = "generic_key"
				}
				es = append(es, descEntry{kind: entGeneric, key: k, value: e.GenericKey})
			case e.RouteName:
				es = append(es, descEntry{kind: entRoute, key: "route_name"})
			}
		}
		gl.descs = append(gl.descs, es)
	}
	return gl
}

// descriptors builds the request's descriptors; one whose header is
// absent is left out, as Envoy leaves out a descriptor an action cannot
// produce.
func (ex *Exchange) descriptors(gl *globalLimit) []*rlcommon.RateLimitDescriptor {
	out := make([]*rlcommon.RateLimitDescriptor, 0, len(gl.descs))
next:
	for _, d := range gl.descs {
		entries := make([]*rlcommon.RateLimitDescriptor_Entry, 0, len(d))
		for i := range d {
			e := &d[i]
			var v string
			switch e.kind {
			case entRemote:
				v = string(ex.clientKey())
			case entHeader:
				h := ex.headField(e.header)
				if h == nil {
					continue next
				}
				v = string(h)
			case entGeneric:
				v = e.value
			case entRoute:
				v = ex.rt.name
			}
			entries = append(entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.key, Value: v})
		}
		out = append(out, &rlcommon.RateLimitDescriptor{Entries: entries})
	}
	return out
}

var (
	valueGlobalPolicy = []byte(`"global"`)
	value500Body      = "internal server error"
)

// globalLimited asks the service about the request; true means a
// response (429, or 500 for a failure with failure_mode deny) is staged.
func (ex *Exchange) globalLimited(gl *globalLimit) bool {
	svc := ex.tbl.rls
	if svc == nil {
		return false // a configuration built without validation
	}
	descs := ex.descriptors(gl)
	if len(descs) == 0 {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), svc.cfg.Timeout)
	resp, err := svc.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: svc.cfg.Domain, Descriptors: descs, HitsAddend: 1})
	cancel()
	if err == nil {
		err = rlsHeadersBounded(resp)
	}
	if err != nil || resp.GetOverallCode() == rlsv3.RateLimitResponse_UNKNOWN {
		ex.core.stats.globalErrors.Add(1)
		if ok, suppressed := ex.core.logRLS.Allow(); ok {
			e := ex.logFields(ex.core.log.Warn()).Str("service", svc.cfg.Address).Err(err)
			if suppressed > 0 {
				e = e.Uint64("suppressed", suppressed)
			}
			e.Msg("rate limit service failed")
		}
		if svc.cfg.FailureMode == config.RateLimitFailDeny {
			ex.local(500, value500Body, "rate limit service failed")
			return true
		}
		return false
	}
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
		if hs := resp.GetRequestHeadersToAdd(); len(hs) > 0 {
			for _, h := range hs {
				if name, value, ok := checkedHeader(h); ok {
					ex.hdr = applyIn(ex.hdr, protocol.HeaderSet, ex.keep(name), ex.keep(value))
				}
			}
			ex.viewDirty = true
		}
		ex.globalOK(gl, resp)
		return false
	}
	// OVER_LIMIT.
	ex.core.stats.globalLimited.Add(1)
	var reset time.Duration
	var policy []byte
	for _, st := range resp.GetStatuses() {
		if st.GetCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
			continue
		}
		if d := st.GetDurationUntilReset().AsDuration(); d > reset {
			reset = d
		}
		if l := st.GetCurrentLimit(); l != nil && policy == nil {
			policy = append(append([]byte(nil), valueGlobalPolicy...), ";q="...)
			policy = strconv.AppendUint(policy, uint64(l.GetRequestsPerUnit()), 10)
			policy = append(policy, ";w="...)
			policy = strconv.AppendInt(policy, unitSeconds(l.GetUnit()), 10)
		}
	}
	ex.tooMany(valueGlobalPolicy, max(ceilSeconds(reset), 1), policy, "rate limited by the service")
	r := &ex.resp
	for _, h := range resp.GetResponseHeadersToAdd() {
		if name, value, ok := checkedHeader(h); ok {
			r.Fields = append(r.Fields, Field{Name: name, Value: value})
		}
	}
	return true
}

// globalOK keeps for the client's response (limitFields) what an OK
// answer adds to it, as Envoy's rate limit filter does: the service's
// response_headers_to_add, and with headers: always the RateLimit-Policy
// and RateLimit fields of the descriptor status with the fewest requests
// left (Envoy's enable_x_ratelimit_headers, in the draft's current
// fields).
func (ex *Exchange) globalOK(gl *globalLimit, resp *rlsv3.RateLimitResponse) {
	rs := &ex.rs
	for _, h := range resp.GetResponseHeadersToAdd() {
		if name, value, ok := checkedHeader(h); ok {
			rs.rlFields = append(rs.rlFields, Field{Name: name, Value: value})
		}
	}
	if !gl.always {
		return
	}
	var tight *rlsv3.RateLimitResponse_DescriptorStatus
	for _, st := range resp.GetStatuses() {
		if st.GetCurrentLimit() != nil && (tight == nil || st.GetLimitRemaining() < tight.GetLimitRemaining()) {
			tight = st
		}
	}
	if tight == nil {
		return // the service names no limit: nothing to say
	}
	l := tight.GetCurrentLimit()
	w := unitSeconds(l.GetUnit())
	if w == 0 {
		return // a unit the draft's window cannot say
	}
	t := w
	if d := tight.GetDurationUntilReset(); d != nil {
		t = ceilSeconds(d.AsDuration())
	}
	b := append(valueGlobalPolicy[:len(valueGlobalPolicy):len(valueGlobalPolicy)], ";q="...)
	b = strconv.AppendUint(b, uint64(l.GetRequestsPerUnit()), 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, w, 10)
	n := len(b)
	b = append(b, valueGlobalPolicy...)
	b = append(b, ";r="...)
	b = strconv.AppendUint(b, uint64(tight.GetLimitRemaining()), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, t, 10)
	rs.rlFields = append(rs.rlFields, Field{Name: hdrRateLimitPolicy, Value: b[:n:n]}, Field{Name: hdrRateLimit, Value: b[n:]})
}

// The headers one answer of the rate limit service may add, its request
// and response lists together: the bounds of an agent reply's header
// operations by default (limits.header_ops and header_bytes). Without
// them a service (or whoever answers in its place) could put up to its
// 4 MiB message of fields on every response.
const (
	rlsMaxHeaders     = 256
	rlsMaxHeaderBytes = 64 << 10
)

// errRLSHeaders: an answer over the bounds above, a failed call.
var errRLSHeaders = errors.New("the answer adds too many headers")

// rlsHeadersBounded checks resp's header lists against the bounds.
func rlsHeadersBounded(resp *rlsv3.RateLimitResponse) error {
	req, res := resp.GetRequestHeadersToAdd(), resp.GetResponseHeadersToAdd()
	if len(req)+len(res) > rlsMaxHeaders {
		return fmt.Errorf("%w: %d, at most %d", errRLSHeaders, len(req)+len(res), rlsMaxHeaders)
	}
	n := 0
	for _, hs := range [2][]*corev3.HeaderValue{req, res} {
		for _, h := range hs {
			n += len(h.GetKey()) + max(len(h.GetValue()), len(h.GetRawValue()))
		}
	}
	if n > rlsMaxHeaderBytes {
		return fmt.Errorf("%w: %d bytes, at most %d", errRLSHeaders, n, rlsMaxHeaderBytes)
	}
	return nil
}

// checkedHeader is a header of the service's answer that passes the rules
// of agents' header operations.
func checkedHeader(h *corev3.HeaderValue) (name, value []byte, ok bool) {
	name, value = []byte(h.GetKey()), []byte(h.GetValue())
	if len(value) == 0 && len(h.GetRawValue()) > 0 {
		value = h.GetRawValue()
	}
	op := protocol.HeaderOp{Op: protocol.HeaderSet, Name: name, Value: value}
	_, why := checkOp(nil, &op)
	return name, value, why == ""
}

func unitSeconds(u rlsv3.RateLimitResponse_RateLimit_Unit) int64 {
	switch u {
	case rlsv3.RateLimitResponse_RateLimit_SECOND:
		return 1
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		return 60
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		return 3600
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		return 86400
	case rlsv3.RateLimitResponse_RateLimit_WEEK:
		return 7 * 86400
	case rlsv3.RateLimitResponse_RateLimit_MONTH:
		return 30 * 86400
	case rlsv3.RateLimitResponse_RateLimit_YEAR:
		return 365 * 86400
	}
	return 0
}
