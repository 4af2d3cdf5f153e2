// Package agentcheck is a conformance and soak kit for agents of protocol
// v2 written in any language. It connects to an agent the way the sidecar
// would (UDS, gRPC, or by listening for a reverse registration), runs a
// table of protocol checks that each cite the rule of docs/protocol.md
// they hold the agent to, optionally puts the agent under steady load
// (decisions/s, latency percentiles, resident memory over time) and
// compares the agent's decisions with an expectations file written by the
// agent's author.
//
// Unlike the proxy, the checker speaks frames itself: it sends malformed,
// oversized and unknown frames and closes connections at awkward moments,
// so that an agent is proven to survive what a real network and a real
// proxy do to it. Every wait is bounded by Config.Timeout.
package agentcheck

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Errors of the kit. Wrapped with details; test with errors.Is.
var (
	// ErrConfig: the Config cannot be used (unknown transport, no address).
	ErrConfig = errors.New("agentcheck: invalid config")
	// ErrConnect: the agent could not be reached or set up (dial,
	// handshake, registration).
	ErrConnect = errors.New("agentcheck: cannot set up a connection to the agent")
	// ErrTimeout: the agent did not answer within the timeout.
	ErrTimeout = errors.New("agentcheck: timed out waiting for the agent")
	// ErrClosed: the agent closed the connection.
	ErrClosed = errors.New("agentcheck: connection closed by the agent")
	// ErrExpectations: the expectations file is unusable.
	ErrExpectations = errors.New("agentcheck: invalid expectations")
	// ErrUnreachable: nothing answers at the agent's address (for a
	// reverse agent: nothing connected within ReconnectWait); no check
	// ran. Returned as an *UnreachableError.
	ErrUnreachable = errors.New("agentcheck: agent unreachable")
)

// UnreachableError is Run's error when the agent cannot be reached at
// all: every check would fail the same way, so none runs.
type UnreachableError struct {
	// Address is the agent's address as configured.
	Address string
	// Err is why: the dial's error, or the reverse wait that ran out.
	Err error
}

func (e *UnreachableError) Error() string {
	return "cannot connect to " + e.Address + ": " + e.Err.Error()
}

// Unwrap returns ErrUnreachable and the cause.
func (e *UnreachableError) Unwrap() []error { return []error{ErrUnreachable, e.Err} }

// Transports the kit speaks.
const (
	TransportUDS     = "uds"
	TransportGRPC    = "grpc"
	TransportReverse = "reverse"
)

// Defaults of Config.
const (
	// DefaultTimeout bounds each wait for one answer of the agent.
	DefaultTimeout = 2 * time.Second
	// DefaultReconnectWait bounds the wait for a reverse agent to come back
	// after the checker closed or refused its connection. The Go SDK's
	// slowest retry pace is 30s, used only after refusals retrying cannot
	// fix, which the checker never sends.
	DefaultReconnectWait = 15 * time.Second
	// DefaultConcurrency is the number of requests the soak keeps in flight
	// (lowered to the agent's max_concurrent_requests).
	DefaultConcurrency = 16
	// DefaultCorrelationRequests is how many requests the correlation check
	// puts in flight at once (lowered to max_concurrent_requests).
	DefaultCorrelationRequests = 64
)

// Config says how to reach the agent and what to run.
type Config struct {
	// Transport is "uds", "grpc" or "reverse".
	Transport string
	// Address is the agent's Unix socket path (uds), its gRPC address
	// (host:port or unix:///path), or where the checker listens for the
	// reverse agent (a path with a '/' is a Unix socket, else host:port).
	Address string
	// Token is the registration token a reverse agent must present (empty:
	// any token is accepted).
	Token string
	// PID, when non-zero, is the agent's process: the checker watches it
	// for crashes, CPU spinning and memory growth (Linux /proc).
	PID int
	// Timeout bounds each wait for one answer (default DefaultTimeout).
	Timeout time.Duration
	// ReconnectWait bounds the wait for a reverse agent to register again
	// (default DefaultReconnectWait).
	ReconnectWait time.Duration

	// Soak and Requests enable the soak: load for this long, or this many
	// requests (both zero: no soak).
	Soak     time.Duration
	Requests int
	// Concurrency is the number of requests the soak keeps in flight
	// (default DefaultConcurrency).
	Concurrency int
	// RSSInterval is how often the soak samples the agent's RSS (default
	// 1s, or a tenth of the soak when that is shorter).
	RSSInterval time.Duration
	// LeakWarnPercent and LeakFailPercent: growth of the agent's RSS from
	// the first to the last quarter of the soak that is reported as WARN
	// and FAIL (defaults 25 and 100), when it is also at least LeakMinBytes
	// (default 8 MiB).
	LeakWarnPercent float64
	LeakFailPercent float64
	LeakMinBytes    int64

	// Expectations, when set, are run after the protocol checks.
	Expectations *Expectations

	// PayloadEncoding is "json" (default) or "protobuf": with protobuf the
	// checker offers protobuf_payloads (uds) or answers
	// payload_encoding "protobuf" (reverse), requires the agent to declare
	// supports_protobuf_payloads and runs every check on protobuf payloads
	// (docs/protocol.md §2.7). The checks that send hand-made bad frames
	// send protobuf garbage then instead of broken JSON.
	PayloadEncoding string

	// Only, when non-empty, runs only the checks with these ids.
	Only []string
	// SkipChecks is true to run only the soak and the expectations.
	SkipChecks bool
}

func (c *Config) defaults() error {
	switch c.Transport {
	case TransportUDS, TransportGRPC, TransportReverse:
	case "":
		c.Transport = TransportUDS
	default:
		return fmt.Errorf("%w: transport %q is not uds, grpc or reverse", ErrConfig, c.Transport)
	}
	if c.Address == "" {
		return fmt.Errorf("%w: address is empty", ErrConfig)
	}
	switch c.PayloadEncoding {
	case "", protocol.EncodingJSON:
		c.PayloadEncoding = protocol.EncodingJSON
	case protocol.EncodingProtobuf:
		if c.Transport == TransportGRPC {
			return fmt.Errorf("%w: payload encoding applies to uds and reverse (gRPC is protobuf already)", ErrConfig)
		}
	default:
		return fmt.Errorf("%w: payload encoding %q is not json or protobuf", ErrConfig, c.PayloadEncoding)
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.ReconnectWait <= 0 {
		c.ReconnectWait = DefaultReconnectWait
	}
	if c.Concurrency <= 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.Soak < 0 || c.Requests < 0 {
		return fmt.Errorf("%w: negative soak", ErrConfig)
	}
	if c.LeakWarnPercent <= 0 {
		c.LeakWarnPercent = 25
	}
	if c.LeakFailPercent <= 0 {
		c.LeakFailPercent = 100
	}
	if c.LeakMinBytes <= 0 {
		c.LeakMinBytes = 8 << 20
	}
	return nil
}

// Status is the outcome of one check.
type Status string

// Outcomes, from best to worst (SKIP: the check does not apply).
const (
	Pass Status = "PASS"
	Skip Status = "SKIP"
	Warn Status = "WARN"
	Fail Status = "FAIL"
)

// Result is the outcome of one check with its evidence.
type Result struct {
	// ID is the check's stable name (handshake, ping, …).
	ID string `json:"id"`
	// Title says what was checked.
	Title  string `json:"title"`
	Status Status `json:"status"`
	// Detail says what happened, with numbers.
	Detail string `json:"detail,omitempty"`
	// Rule cites the section of docs/protocol.md the check holds the agent to.
	Rule string `json:"rule,omitempty"`
	// Sent and Received are the frames (type and payload) that show it.
	Sent     []string `json:"sent,omitempty"`
	Received []string `json:"received,omitempty"`
	// Elapsed is how long the check took.
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Report is everything one run found.
type Report struct {
	Transport string   `json:"transport"`
	Address   string   `json:"address"`
	Agent     string   `json:"agent,omitempty"`
	Results   []Result `json:"results"`
	// Soak is set when a soak ran.
	Soak *SoakReport `json:"soak,omitempty"`
}

// Counts returns how many results have each status.
func (r *Report) Counts() map[Status]int {
	m := map[Status]int{}
	for _, x := range r.Results {
		m[x.Status]++
	}
	return m
}

// Failed reports whether any result is FAIL.
func (r *Report) Failed() bool { return r.Counts()[Fail] > 0 }

// Find returns the result with the given id (nil when it did not run).
func (r *Report) Find(id string) *Result {
	for i := range r.Results {
		if r.Results[i].ID == id {
			return &r.Results[i]
		}
	}
	return nil
}

// Run checks the agent described by cfg and returns the report. The error
// is for a config that cannot run at all, or an *UnreachableError when
// nothing answers at the address (no check runs then); an agent that
// answers and fails a check is a FAIL in the report.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	env, err := newEnv(ctx, &cfg)
	if err != nil {
		return nil, err
	}
	defer env.close()
	if err := env.reach(); err != nil {
		return nil, err
	}
	rep := &Report{Transport: cfg.Transport, Address: cfg.Address}
	env.report = rep
	env.runAll()
	return rep, nil
}
