package transports

import (
	"strconv"
	"strings"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// Key identifies an agent instance. Two configured agents with the same
// Key are served by the same instance: its connections, its in-flight and
// queue limits, its timers and its reconnect loop. A reload keeps the
// running instance of an agent whose Key did not change and builds a new
// one (new connections, counters from zero) when it did.
//
// A Key holds exactly the fields of config.Agent that the transport reads
// when it builds the instance; it is comparable with ==.
type Key struct {
	// Name is part of the instance: it reports it in its status and
	// metrics, logs with it and, for reverse agents, registrations name it.
	Name      string
	Transport string
	// Address is where the instance dials (uds: the socket path, with or
	// without "unix:"; grpc: the target) or listens (reverse).
	Address     string
	Conns       int
	MaxInFlight int
	MaxQueue    int
	// Connect and Handshake bound connection setup. gRPC has one budget
	// for both: its Connect holds the sum and Handshake is zero.
	Connect   time.Duration
	Handshake time.Duration
	// Message bounds the wait for each reply; Frame a frame once begun.
	Message time.Duration
	Frame   time.Duration
	// MaxPending caps the bytes queued per connection (uds, reverse).
	MaxPending int
	// PayloadEncoding is offered in the handshake or accepted at
	// registration (uds, reverse).
	PayloadEncoding string
	// Options are the transport's options in a canonical form (TLS files,
	// server name and health interval for grpc; tokens, ids and listener
	// settings for reverse; uds takes none).
	Options string
	// Members are the addresses besides Address (uds, grpc: one client
	// each, combined in an agentmux.Multi), and Failover whether the Multi
	// opens an exchange on another member (only with Members).
	Members  string
	Failover bool
	// Routes are the context_extensions the routes set for an ext_authz
	// agent, in a canonical form: the instance sends them (RouteKey).
	Routes string
}

// RouteKey returns the Key of agent a of cfg: InstanceKey, and for an
// ext_authz agent the context_extensions cfg's routes set for it, so
// that a reload that changes them builds a new instance.
func RouteKey(cfg *config.Config, a *config.Agent) Key {
	k := InstanceKey(*a)
	if a.Transport != config.TransportExtAuthz {
		return k
	}
	routes := cfg.RouteContextExtensions(a.Name)
	var b strings.Builder
	for _, r := range sortedKeys(routes) {
		b.WriteString(strconv.Quote(r))
		b.WriteByte(':')
		b.WriteString(canonicalOptions(routes[r]))
		b.WriteByte('\n')
	}
	k.Routes = b.String()
	return k
}

// InstanceKey returns the Key of a: the fields that need a new instance
// when they change, per transport:
//
//	uds      name, address, conns, max_in_flight, max_queue,
//	         max_pending_bytes, payload_encoding, timeouts connect,
//	         handshake, message, frame
//	grpc     name, address, conns, max_in_flight, max_queue,
//	         timeouts connect+handshake (one dial budget), message; options
//	ext_proc as grpc
//	reverse  name, address, max_in_flight, max_queue, max_pending_bytes,
//	         payload_encoding, timeouts message, frame; options (the agents dial in: no
//	         conns, connect or handshake of ours)
//
// Not in the Key are the fields the dataplane applies per request from
// the routing table — failure_mode, failure_status, timeouts.request,
// request_body, response_body and limits (header limits of a reply) — and the route
// overrides of the same. The table is rebuilt from the new configuration
// on every swap, so an instance kept because only these changed serves
// the next request under the new policy. Rebuilding it instead would
// drop its connections and queued requests for nothing.
//
// An agent that keeps its Key but whose transport reads a file (TLS
// certificates, token_file) is not rebuilt when only the file's content
// changes: the Key compares paths, not contents.
func InstanceKey(a config.Agent) Key {
	k := Key{
		Name:        a.Name,
		Transport:   a.Transport,
		Address:     a.Address,
		Conns:       a.Conns,
		MaxInFlight: a.MaxInFlight,
		MaxQueue:    a.MaxQueue,
		Connect:     a.Timeouts.Connect,
		Handshake:   a.Timeouts.Handshake,
		Message:     a.Timeouts.Message,
		Frame:       a.Timeouts.Frame,
		MaxPending:  int(a.MaxPendingBytes),
		Options:     canonicalOptions(a.Options),

		PayloadEncoding: a.PayloadEncoding,
	}
	if len(a.Addresses) > 0 {
		k.Members = strings.Join(a.Addresses, "\n")
		k.Failover = a.FailoverOn()
	}
	switch a.Transport {
	case config.TransportUDS:
		k.Address = udsPath(a.Address)
	case config.TransportGRPC, config.TransportExtProc, config.TransportExtAuthz, config.TransportHTTPAuth:
		k.Connect, k.Handshake = a.Timeouts.Connect+a.Timeouts.Handshake, 0
		k.Frame, k.MaxPending, k.PayloadEncoding = 0, 0, ""
	case config.TransportReverse:
		k.Conns, k.Connect, k.Handshake = 0, 0, 0
	}
	return k
}

// canonicalOptions writes m sorted by key, each key and value quoted.
func canonicalOptions(m map[string]string) string {
	if len(m) == 0 {
		return ""
	}
	var b strings.Builder
	for _, k := range sortedKeys(m) {
		b.WriteString(strconv.Quote(k))
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
		b.WriteByte(';')
	}
	return b.String()
}
