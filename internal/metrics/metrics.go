// Package metrics exports the sidecar's Prometheus metrics: it implements
// observe.Observer (requests by route and outcome, agent round-trip
// latency per phase, agent errors by kind, body bytes) and reads, at
// scrape time, the dataplane's counters and what every agent instance
// reports of itself through agentmux.Reporter, whatever its transport
// (connections, in-flight, late replies, an ext_proc agent's events, a
// reverse agent's listener and its registrations).
//
// The request path never builds a label set: Reset resolves every
// counter and histogram of the new routing table into slices indexed like
// the Observer's route and agent indices, and swaps them in atomically, so
// an event costs an atomic load, a bounds check and the metric update.
//
// Metric names and labels are listed in docs/operations.md.
package metrics

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/gomaxprocs"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/protocol"
)

// ErrMetricsRegister is returned when the collectors cannot be registered
// (a registry that already holds metrics of the same names).
var ErrMetricsRegister = errors.New("metrics: cannot register collectors")

// Namespace prefixes every metric name.
const Namespace = "sidecar"

// NoRoute is the route label of requests that matched no route. Route
// names cannot contain parentheses, so it never collides with one.
const NoRoute = "(none)"

// Agent error kinds (label kind of sidecar_agent_errors_total).
const (
	KindTimeout         = "timeout"
	KindUnavailable     = "unavailable"
	KindOverloaded      = "overloaded"
	KindConnectionLost  = "connection_lost"
	KindProtocolError   = "protocol_error"
	KindRefusedMutation = "refused_mutation"
	KindLateReply       = "late_reply"
)

// Error kinds counted per event, in handle order.
const (
	errTimeout = iota
	errUnavailable
	errOverloaded
	errConnLost
	errProtocol
	errRefused
	numErrKinds
)

var errKindNames = [numErrKinds]string{KindTimeout, KindUnavailable, KindOverloaded, KindConnectionLost, KindProtocolError, KindRefusedMutation}

// Decisions counted per agent, in handle order.
const (
	decAllow = iota
	decBlock
	decRedirect
	decContinue
	numDecisions
)

var decisionNames = [numDecisions]string{"allow", "block", "redirect", "continue"}

var directionNames = [2]string{"request", "response"}

// AgentLatencyBuckets are the upper bounds (seconds) of the agent
// round-trip histograms: 10µs doubling to about 1.3s.
var AgentLatencyBuckets = prometheus.ExponentialBuckets(10e-6, 2, 18)

// RequestDurationBuckets are the upper bounds (seconds) of the request
// duration histograms: 25µs doubling to about 26s.
var RequestDurationBuckets = prometheus.ExponentialBuckets(25e-6, 2, 21)

// Config configures Metrics.
type Config struct {
	// Registry receives the collectors (default: a new registry that also
	// carries the Go runtime and process collectors).
	Registry *prometheus.Registry
	// Version is exported as the version label of sidecar_build_info.
	Version string
}

// Metrics is the sidecar's set of Prometheus collectors. It implements
// observe.Observer and observe.RequestRecorder; its methods are safe
// for concurrent use, Reset included.
type Metrics struct {
	reg *prometheus.Registry

	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	upstream   *prometheus.CounterVec
	bodyBytes  *prometheus.CounterVec
	inspected  *prometheus.CounterVec
	mutated    *prometheus.CounterVec
	latency    *prometheus.HistogramVec
	decisions  *prometheus.CounterVec
	errs       *prometheus.CounterVec
	failures   *prometheus.CounterVec
	skipped    *prometheus.CounterVec
	reloads    *prometheus.CounterVec
	reloadTime prometheus.Gauge

	h atomic.Pointer[handles]
	// resetMu orders concurrent Resets (each builds a whole table).
	resetMu sync.Mutex

	agents atomic.Pointer[func() []agentmux.AgentStatus]
	stats  atomic.Pointer[func() observe.Stats]
	ups    upstreamCollector // endpoint state (upstreams.go)
	policy atomic.Pointer[func() observe.PolicyStatus]
}

// handles are the label-resolved metrics of one routing table.
type handles struct {
	routes  []routeHandles
	noRoute routeHandles
	agents  []agentHandles
}

type routeHandles struct {
	outcome   [observe.NumRequestOutcomes]prometheus.Counter
	duration  prometheus.Observer
	upstream  [2]prometheus.Counter // error, timeout
	bytesIn   prometheus.Counter
	bytesOut  prometheus.Counter
	inspected [2]prometheus.Counter
	mutated   [2]prometheus.Counter
}

type agentHandles struct {
	latency    [observe.NumPhases]prometheus.Observer
	decisions  [numDecisions]prometheus.Counter
	errs       [numErrKinds]prometheus.Counter
	failOpen   prometheus.Counter
	failClosed prometheus.Counter
	skipped    [2]prometheus.Counter
}

// New creates the collectors and registers them.
func New(cfg Config) (*Metrics, error) {
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
		if err := reg.Register(newWithoutFamily(collectors.NewGoCollector(), omCollision)); err != nil {
			return nil, errors.Join(ErrMetricsRegister, err)
		}
		if err := reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})); err != nil {
			return nil, errors.Join(ErrMetricsRegister, err)
		}
	}
	m := &Metrics{reg: reg}
	m.requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "requests_total",
		Help: "Requests handled, by route and outcome (allowed, blocked, redirected, client_gone, failed_closed, upstream_error, failed_open, rejected).",
	}, []string{"route", "outcome"})
	m.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "request_duration_seconds",
		Help:    "Time from a request's arrival to the end of its response, by route.",
		Buckets: RequestDurationBuckets,
	}, []string{"route"})
	m.upstream = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "upstream_errors_total",
		Help: "Upstream failures answered 502/503 (kind error) or 504 (kind timeout), by route.",
	}, []string{"route", "kind"})
	m.bodyBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "body_bytes_total",
		Help: "Body bytes read from clients (direction in) and written to them (direction out), by route.",
	}, []string{"route", "direction"})
	m.inspected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "body_bytes_inspected_total",
		Help: "Body bytes shown to at least one agent, by route and direction (request, response).",
	}, []string{"route", "direction"})
	m.mutated = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "body_bytes_mutated_total",
		Help: "Body bytes an agent replaced or dropped, by route and direction (request, response).",
	}, []string{"route", "direction"})
	m.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: Namespace, Name: "agent_latency_seconds",
		Help:    "Agent round-trip time of events that got a reply, by agent and phase (request_headers, request_body, response_headers, response_body).",
		Buckets: AgentLatencyBuckets,
	}, []string{"agent", "phase"})
	m.decisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "agent_decisions_total",
		Help: "Agent replies by agent and decision (allow, block, redirect, continue: needs_more or a body chunk let through).",
	}, []string{"agent", "decision"})
	m.errs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "agent_errors_total",
		Help: agentErrorsHelp,
	}, []string{"agent", "kind"})
	m.failures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "agent_failures_total",
		Help: "Agent failures that decided a request by failure policy: open (passed, marked) or closed (503/504), by agent.",
	}, []string{"agent", "policy"})
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "agent_inspection_skipped_total",
		Help: "Bodies passed uninspected because they exceeded the agent's buffer limit, by agent and direction.",
	}, []string{"agent", "direction"})
	m.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: Namespace, Name: "config_reloads_total",
		Help: "Configuration reloads by result (success, failure).",
	}, []string{"result"})
	m.reloadTime = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "config_last_reload_success_timestamp_seconds",
		Help: "Unix time of the last successful configuration load.",
	})
	build := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Always 1; labels carry the sidecar and Go versions.",
	}, []string{"version", "go_version"})
	version := cfg.Version
	if version == "" {
		version = "unknown"
	}
	build.WithLabelValues(version, runtime.Version()).Set(1)
	// GOMAXPROCS itself is the Go collector's go_sched_gomaxprocs_threads.
	adaptive := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "gomaxprocs_adaptive",
		Help: "1 while GOMAXPROCS is adapted to the load (sidecar run -gomaxprocs adaptive), else 0.",
	}, func() float64 {
		if gomaxprocs.Adapting() {
			return 1
		}
		return 0
	})
	changes := make([]prometheus.Collector, 0, 2)
	for _, dir := range []string{"up", "down"} {
		changes = append(changes, prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: Namespace, Name: "gomaxprocs_changes_total",
			Help:        "Changes of GOMAXPROCS to fit the load, by direction (up, down).",
			ConstLabels: prometheus.Labels{"direction": dir},
		}, func() float64 {
			up, down := gomaxprocs.Changes()
			if dir == "up" {
				return float64(up)
			}
			return float64(down)
		}))
	}
	m.ups.stats = &m.stats
	for _, c := range []prometheus.Collector{
		m.requests, m.duration, m.upstream, m.bodyBytes, m.inspected, m.mutated,
		m.latency, m.decisions, m.errs, m.failures, m.skipped, m.reloads, m.reloadTime,
		build, adaptive, changes[0], changes[1],
		&scrapeCollector{m: m}, &lateCollector{m: m}, &policyCollector{m: m}, &m.ups,
	} {
		if err := reg.Register(c); err != nil {
			return nil, errors.Join(ErrMetricsRegister, err)
		}
	}
	for _, r := range []string{"success", "failure"} {
		m.reloads.WithLabelValues(r)
	}
	m.reloadTime.SetToCurrentTime()
	m.Reset(nil, nil)
	return m, nil
}

// Registry returns the registry the collectors are registered with (for
// the admin listener's /metrics).
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// SetAgents sets where scrapes read the agents' reports
// (dataplane.Server.AgentStatus, each agent's agentmux.Reporter): their
// connections and counters, an ext_proc agent's events, a reverse agent's
// listener; nil stops those metrics.
func (m *Metrics) SetAgents(f func() []agentmux.AgentStatus) {
	if f == nil {
		m.agents.Store(nil)
		return
	}
	m.agents.Store(&f)
}

// SetStats sets where scrapes read the dataplane's counters
// (dataplane.Server.Stats); nil stops those metrics.
func (m *Metrics) SetStats(f func() observe.Stats) {
	if f == nil {
		m.stats.Store(nil)
		return
	}
	m.stats.Store(&f)
}

// ConfigReloaded counts a configuration reload; err nil is a success.
func (m *Metrics) ConfigReloaded(err error) {
	if err != nil {
		m.reloads.WithLabelValues("failure").Inc()
		return
	}
	m.reloads.WithLabelValues("success").Inc()
	m.reloadTime.SetToCurrentTime()
}

// Reset implements observe.Observer: it resolves the metrics of the
// routes and agents of a new routing table and swaps them in. Series of
// names no longer configured are kept (counters stay monotonic when a
// name comes back).
func (m *Metrics) Reset(routes, agents []string) {
	m.resetMu.Lock()
	defer m.resetMu.Unlock()
	h := &handles{routes: make([]routeHandles, len(routes)), agents: make([]agentHandles, len(agents))}
	for i, name := range routes {
		m.routeHandles(&h.routes[i], name)
	}
	m.routeHandles(&h.noRoute, NoRoute)
	for i, name := range agents {
		a := &h.agents[i]
		for p := range a.latency {
			a.latency[p] = m.latency.WithLabelValues(name, observe.PhaseNames[p])
		}
		for d := range a.decisions {
			a.decisions[d] = m.decisions.WithLabelValues(name, decisionNames[d])
		}
		for k := range a.errs {
			a.errs[k] = m.errs.WithLabelValues(name, errKindNames[k])
		}
		a.failOpen = m.failures.WithLabelValues(name, "open")
		a.failClosed = m.failures.WithLabelValues(name, "closed")
		for d := range a.skipped {
			a.skipped[d] = m.skipped.WithLabelValues(name, directionNames[d])
		}
	}
	m.h.Store(h)
}

func (m *Metrics) routeHandles(r *routeHandles, name string) {
	for o := range r.outcome {
		r.outcome[o] = m.requests.WithLabelValues(name, observe.RequestOutcome(o).String())
	}
	r.duration = m.duration.WithLabelValues(name)
	r.upstream[0] = m.upstream.WithLabelValues(name, "error")
	r.upstream[1] = m.upstream.WithLabelValues(name, "timeout")
	r.bytesIn = m.bodyBytes.WithLabelValues(name, "in")
	r.bytesOut = m.bodyBytes.WithLabelValues(name, "out")
	for d := range r.inspected {
		r.inspected[d] = m.inspected.WithLabelValues(name, directionNames[d])
		r.mutated[d] = m.mutated.WithLabelValues(name, directionNames[d])
	}
}

func (h *handles) route(i int) *routeHandles {
	if uint(i) < uint(len(h.routes)) {
		return &h.routes[i]
	}
	return &h.noRoute
}

func (h *handles) agent(i int) *agentHandles {
	if uint(i) < uint(len(h.agents)) {
		return &h.agents[i]
	}
	return nil
}

// Request implements observe.Observer. Everything about a finished
// request is counted in RecordRequest, from its summary.
func (m *Metrics) Request(int, int, time.Duration) {}

// RecordRequest implements observe.RequestRecorder.
func (m *Metrics) RecordRequest(s *observe.RequestSummary) {
	h := m.h.Load()
	r := h.route(s.Route)
	if o := int(s.Outcome); o < len(r.outcome) {
		r.outcome[o].Inc()
	}
	r.duration.Observe(s.Duration.Seconds())
	if s.BytesIn > 0 {
		r.bytesIn.Add(float64(s.BytesIn))
	}
	if s.BytesOut > 0 {
		r.bytesOut.Add(float64(s.BytesOut))
	}
	for d := range s.Inspected {
		if n := s.Inspected[d]; n > 0 {
			r.inspected[d].Add(float64(n))
		}
		if n := s.Mutated[d]; n > 0 {
			r.mutated[d].Add(float64(n))
		}
	}
	if s.Outcome == observe.RequestFailedClosed {
		if a := h.agent(s.Agent); a != nil {
			a.failClosed.Inc()
		}
	}
}

// AgentEvent implements observe.Observer.
func (m *Metrics) AgentEvent(route, agent int, phase protocol.Phase, body bool, o observe.Outcome, d time.Duration) {
	a := m.h.Load().agent(agent)
	if a == nil {
		return
	}
	switch o {
	case observe.OutcomeAllow:
		a.decisions[decAllow].Inc()
	case observe.OutcomeBlock:
		a.decisions[decBlock].Inc()
	case observe.OutcomeRedirect:
		a.decisions[decRedirect].Inc()
	case observe.OutcomeContinue:
		a.decisions[decContinue].Inc()
	case observe.OutcomeTimeout:
		a.errs[errTimeout].Inc()
		return
	case observe.OutcomeUnavailable:
		a.errs[errUnavailable].Inc()
		return
	case observe.OutcomeOverloaded:
		a.errs[errOverloaded].Inc()
		return
	case observe.OutcomeConnLost:
		a.errs[errConnLost].Inc()
		return
	case observe.OutcomeInvalid:
		a.errs[errProtocol].Inc()
		if d <= 0 {
			return
		}
	default:
		// Canceled: the client went away; neither a reply nor an agent error.
		return
	}
	a.latency[observe.PhaseIndex(phase, body)].Observe(d.Seconds())
}

// FailOpen implements observe.Observer.
func (m *Metrics) FailOpen(route, agent int) {
	if a := m.h.Load().agent(agent); a != nil {
		a.failOpen.Inc()
	}
}

// MutationRefused implements observe.Observer.
func (m *Metrics) MutationRefused(route, agent int) {
	if a := m.h.Load().agent(agent); a != nil {
		a.errs[errRefused].Inc()
	}
}

// InspectionSkipped implements observe.Observer.
func (m *Metrics) InspectionSkipped(route, agent int, phase protocol.Phase) {
	if a := m.h.Load().agent(agent); a != nil && int(phase) < len(a.skipped) {
		a.skipped[phase].Inc()
	}
}

// Upstream implements observe.Observer.
func (m *Metrics) Upstream(route int, timeout bool) {
	r := m.h.Load().route(route)
	if timeout {
		r.upstream[1].Inc()
	} else {
		r.upstream[0].Inc()
	}
}

var (
	_ observe.Observer        = (*Metrics)(nil)
	_ observe.RequestRecorder = (*Metrics)(nil)
)
