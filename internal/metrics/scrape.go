package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"strings"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
)

// Metrics read at scrape time, from the agents' reports (agentmux.Reporter)
// and the dataplane's counters: they cost the request path nothing.
var (
	descAgentConns = prometheus.NewDesc(Namespace+"_agent_connections",
		"Live connections per agent and transport.", []string{"agent", "transport"}, nil)
	descAgentInFlight = prometheus.NewDesc(Namespace+"_agent_in_flight",
		"Exchanges in flight per agent.", []string{"agent"}, nil)
	descAgentReady = prometheus.NewDesc(Namespace+"_agent_ready",
		"1 when the agent has at least one live connection, else 0.", []string{"agent"}, nil)
	descAgentCompleted = prometheus.NewDesc(Namespace+"_agent_exchanges_completed_total",
		"Exchanges completed per agent (totals of the agent's current instance).", []string{"agent"}, nil)
	descInFlight = prometheus.NewDesc(Namespace+"_requests_in_flight",
		"Requests being handled or streamed now.", nil, nil)
	descAborted = prometheus.NewDesc(Namespace+"_responses_aborted_total",
		"Responses cut off after their headers were sent (an agent's late block or failure, a broken upstream).", nil, nil)
	descRevAccepted = prometheus.NewDesc(Namespace+"_reverse_registrations_accepted_total",
		"Reverse-connection registrations accepted, per listener.", []string{"listener"}, nil)
	descRevRejected = prometheus.NewDesc(Namespace+"_reverse_registrations_rejected_total",
		"Reverse-connection registrations refused or failed, per listener and reason.", []string{"listener", "reason"}, nil)
	descRevConns = prometheus.NewDesc(Namespace+"_reverse_connections",
		"Reverse connections per listener: registering (pending), refused with their answer held back or being drained (refusing), or registered (active).", []string{"listener", "state"}, nil)
	descRevDelayed = prometheus.NewDesc(Namespace+"_reverse_registrations_delayed_total",
		"Refused registrations answered late because of earlier failures of the same (peer, agent id), per listener.", []string{"listener"}, nil)
	descRevUnheld = prometheus.NewDesc(Namespace+"_reverse_refusals_unheld_total",
		"Refused registrations closed at once because max_refusing refused connections were already held open (unanswered if they were to be held back), per listener.", []string{"listener"}, nil)
	descExtProcEvents = prometheus.NewDesc(Namespace+"_extproc_events_total",
		"Events of the ext_proc transport by agent: streams opened, immediate responses, "+
			"clear_route_cache flags ignored, mode overrides honoured and refused, response fields "+
			"ignored, unsupported responses, wrong-phase and unsolicited responses, streams closed "+
			"mid-request and bodies over buffer_limit.",
		[]string{"agent", "event"}, nil)
	descAuthzEvents = prometheus.NewDesc(Namespace+"_authz_events_total",
		"Events of the ext_authz and http_auth transports by agent: checks (calls made), "+
			"ok and denied verdicts, error responses, unsupported responses, response fields ignored, "+
			"probes refused (ext_authz) and denied bodies truncated (http_auth).",
		[]string{"agent", "transport", "event"}, nil)
	descRejected = prometheus.NewDesc(Namespace+"_requests_rejected_total",
		"Request heads the sidecar answered itself with 400, 408, 414 or 431, by reason (target, host, framing, obs_fold, parse, uri_too_long, headers_too_large, timeout).", []string{"reason"}, nil)
	descAbsolute = prometheus.NewDesc(Namespace+"_requests_absolute_form_total",
		"Absolute-form request targets rewritten to origin-form with their authority as Host.", nil, nil)
	descAcceptErrors = prometheus.NewDesc(Namespace+"_accept_errors_total",
		"Accepts that failed for lack of file descriptors or memory; the listener backed off and kept serving.", nil, nil)
	descClamped = prometheus.NewDesc(Namespace+"_listeners_clamped",
		"Listeners whose max_connections was lowered to what the file descriptor limit allows.", nil, nil)
	descUpRetries = prometheus.NewDesc(Namespace+"_upstream_retries_total",
		"Requests replayed on another upstream connection after a stale keep-alive connection failed before any response byte.", nil, nil)
	descUpFlushes = prometheus.NewDesc(Namespace+"_upstream_pool_flushes_total",
		"Idle upstream pools dropped at a stale keep-alive connection (an upstream restart).", nil, nil)
	descUpDiscarded = prometheus.NewDesc(Namespace+"_upstream_conns_discarded_total",
		"Upstream connections closed instead of reused, by reason: unsolicited (the upstream sent bytes no request asked for) or closed (a pooled connection found closed before a request was written on it).", []string{"reason"}, nil)
	descBodyJoined = prometheus.NewDesc(Namespace+"_body_reads_joined_total",
		"Reads of a body's framing (mostly chunks of a chunked body) whose bytes joined an earlier read's in one body chunk because they were already received, by phase (request, response).", []string{"phase"}, nil)
	descBodyTooSlow = prometheus.NewDesc(Namespace+"_request_body_too_slow_total",
		"Request bodies answered 408 for falling behind their listener's body_min_rate by more than body_timeout.", nil, nil)
	// exchangeDescs are described apart from the list above.
	exchangeDescs = []*prometheus.Desc{descUpDiscarded, descBodyJoined, descBodyTooSlow}

	descSendWaits = prometheus.NewDesc(Namespace+"_agent_send_waits_total",
		"Events that waited for room in a connection's pending bytes (max_pending_bytes), per agent.", []string{"agent"}, nil)
	descCtlDropped = prometheus.NewDesc(Namespace+"_agent_control_frames_dropped_total",
		"Pings, pongs and cancels dropped because a connection's send queue was full, per agent.", []string{"agent"}, nil)
	descWrites = prometheus.NewDesc(Namespace+"_agent_writes_total",
		"Writes of batched frames to an agent's connections, per agent (UDS and reverse transports).", []string{"agent"}, nil)
	descFramesWritten = prometheus.NewDesc(Namespace+"_agent_frames_written_total",
		"Frames those writes carried, per agent: frames per write = this / sidecar_agent_writes_total.", []string{"agent"}, nil)
	descLimits = prometheus.NewDesc(Namespace+"_agent_limits_exceeded_total",
		"Agent replies over their header limits (operations, bytes, value size, header block); the agent's failure mode applied.", nil, nil)
	descInline = prometheus.NewDesc(Namespace+"_agent_inline_bodies_total",
		"RequestHeaders events that carried the first chunk of a buffered request body (feature inline_body), each saving an agent round trip.", nil, nil)

	// Routes: local rate limits and retry policies (routing.go).
	descRateLimited = prometheus.NewDesc(Namespace+"_rate_limited_total",
		"Requests answered 429 by a local rate limit, per limit (scope route or listener, and its name).", []string{"scope", "name"}, nil)
	descKeysEvicted = prometheus.NewDesc(Namespace+"_rate_limit_keys_evicted_total",
		"Keys a keyed local rate limit dropped (least recently used first) to stay within its max_keys, per limit (scope route or listener, and its name).", []string{"scope", "name"}, nil)
	// Per route: route names come from the configuration, reasons are
	// the retry_on kinds the route's policy lists.
	descRouteRetries = prometheus.NewDesc(Namespace+"_route_retries_total",
		"Retries made under a route's retry policy, per route and reason (the retry_on kind that triggered it).", []string{"route", "reason"}, nil)
	descRetryBudget = prometheus.NewDesc(Namespace+"_route_retry_budget_exhausted_total",
		"Retries a route's retry budget refused (too many retries in progress on the route), per route.", []string{"route"}, nil)
	descRetryNotReplayable = prometheus.NewDesc(Namespace+"_route_retries_not_replayable_total",
		"Retries a route's policy called for but not made because the request could not be sent again (its body was consumed, or it is not idempotent after a reset or timeout), per route.", []string{"route"}, nil)
	descGlobalLimited = prometheus.NewDesc(Namespace+"_global_rate_limited_total",
		"Requests the rate limit service said were over a limit (429).", nil, nil)
	descGlobalErrors = prometheus.NewDesc(Namespace+"_global_rate_limit_errors_total",
		"Calls to the rate limit service that failed (error, timeout, UNKNOWN, an answer over the header bounds); rate_limit_service.failure_mode applied.", nil, nil)
	routeDescs = []*prometheus.Desc{descRateLimited, descKeysEvicted, descRouteRetries, descRetryBudget, descRetryNotReplayable, descGlobalLimited, descGlobalErrors}

	// descLate shares its family with the per-event agent errors counter.
	descLate = prometheus.NewDesc(Namespace+"_agent_errors_total", agentErrorsHelp, []string{"agent", "kind"}, nil)
)

const agentErrorsHelp = "Agent errors by agent and kind (timeout, unavailable, overloaded, connection_lost, protocol_error, refused_mutation, late_reply)."

type scrapeCollector struct{ m *Metrics }

func (c *scrapeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descAgentConns, descAgentInFlight, descAgentReady, descAgentCompleted,
		descInFlight, descAborted, descRevAccepted, descRevRejected, descRevConns, descRevDelayed, descRevUnheld, descExtProcEvents, descAuthzEvents,
		descRejected, descAbsolute, descAcceptErrors, descClamped, descUpRetries, descUpFlushes, descLimits, descSendWaits, descCtlDropped, descInline,
		descWrites, descFramesWritten} {
		ch <- d
	}
	for _, d := range tlsTunnelDescs {
		ch <- d
	}
	for _, d := range http2Descs {
		ch <- d
	}
	for _, d := range routeDescs {
		ch <- d
	}
	for _, d := range exchangeDescs {
		ch <- d
	}
	for _, d := range connDescs {
		ch <- d
	}
}

func (c *scrapeCollector) Collect(ch chan<- prometheus.Metric) {
	if f := c.m.agents.Load(); f != nil {
		var listeners map[string]bool // reported already: agents share them
		for _, st := range (*f)() {
			ch <- prometheus.MustNewConstMetric(descAgentConns, prometheus.GaugeValue, float64(st.Connections), st.Name, st.Transport)
			ch <- prometheus.MustNewConstMetric(descAgentInFlight, prometheus.GaugeValue, float64(st.InFlight), st.Name)
			ready := 0.0
			if st.Ready {
				ready = 1
			}
			ch <- prometheus.MustNewConstMetric(descAgentReady, prometheus.GaugeValue, ready, st.Name)
			ch <- prometheus.MustNewConstMetric(descAgentCompleted, prometheus.CounterValue, float64(st.Completed), st.Name)
			ch <- prometheus.MustNewConstMetric(descSendWaits, prometheus.CounterValue, float64(st.SendWaits), st.Name)
			ch <- prometheus.MustNewConstMetric(descCtlDropped, prometheus.CounterValue, float64(st.ControlDropped), st.Name)
			if st.Writes > 0 {
				ch <- prometheus.MustNewConstMetric(descWrites, prometheus.CounterValue, float64(st.Writes), st.Name)
				ch <- prometheus.MustNewConstMetric(descFramesWritten, prometheus.CounterValue, float64(st.FramesWritten), st.Name)
			}
			if st.Transport == config.TransportExtProc {
				for event, n := range st.Events {
					ch <- prometheus.MustNewConstMetric(descExtProcEvents, prometheus.CounterValue, float64(n), st.Name, event)
				}
			}
			if st.Transport == config.TransportExtAuthz || st.Transport == config.TransportHTTPAuth {
				for event, n := range st.Events {
					ch <- prometheus.MustNewConstMetric(descAuthzEvents, prometheus.CounterValue, float64(n), st.Name, st.Transport, event)
				}
			}
			if l := st.Listener; l != nil && !listeners[l.Address] {
				if listeners == nil {
					listeners = map[string]bool{}
				}
				listeners[l.Address] = true
				collectListener(ch, l)
			}
		}
	}
	if f := c.m.stats.Load(); f != nil {
		st := (*f)()
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(st.InFlight))
		ch <- prometheus.MustNewConstMetric(descAborted, prometheus.CounterValue, float64(st.ResponseAborted))
		for _, reason := range observe.RejectReasons {
			ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(st.Rejected[reason]), reason)
		}
		ch <- prometheus.MustNewConstMetric(descAbsolute, prometheus.CounterValue, float64(st.AbsoluteForm))
		ch <- prometheus.MustNewConstMetric(descAcceptErrors, prometheus.CounterValue, float64(st.AcceptErrors))
		ch <- prometheus.MustNewConstMetric(descClamped, prometheus.GaugeValue, float64(st.ListenersClamped))
		ch <- prometheus.MustNewConstMetric(descUpRetries, prometheus.CounterValue, float64(st.UpstreamRetries))
		ch <- prometheus.MustNewConstMetric(descUpFlushes, prometheus.CounterValue, float64(st.UpstreamStale))
		ch <- prometheus.MustNewConstMetric(descUpDiscarded, prometheus.CounterValue, float64(st.UpstreamDiscardedUnsolicited), "unsolicited")
		ch <- prometheus.MustNewConstMetric(descUpDiscarded, prometheus.CounterValue, float64(st.UpstreamDiscardedClosed), "closed")
		ch <- prometheus.MustNewConstMetric(descBodyJoined, prometheus.CounterValue, float64(st.RequestBodyReadsJoined), "request")
		ch <- prometheus.MustNewConstMetric(descBodyJoined, prometheus.CounterValue, float64(st.ResponseBodyReadsJoined), "response")
		ch <- prometheus.MustNewConstMetric(descBodyTooSlow, prometheus.CounterValue, float64(st.RequestBodyTooSlow))
		ch <- prometheus.MustNewConstMetric(descLimits, prometheus.CounterValue, float64(st.LimitsExceeded))
		ch <- prometheus.MustNewConstMetric(descInline, prometheus.CounterValue, float64(st.InlineBodies))
		for k, n := range st.RateLimitedBy {
			scope, name, _ := strings.Cut(k, "/")
			ch <- prometheus.MustNewConstMetric(descRateLimited, prometheus.CounterValue, float64(n), scope, name)
		}
		for k, n := range st.RateLimitKeysEvictedBy {
			scope, name, _ := strings.Cut(k, "/")
			ch <- prometheus.MustNewConstMetric(descKeysEvicted, prometheus.CounterValue, float64(n), scope, name)
		}
		for route, rs := range st.RouteRetriesBy {
			for reason, n := range rs.Retries {
				ch <- prometheus.MustNewConstMetric(descRouteRetries, prometheus.CounterValue, float64(n), route, reason)
			}
			ch <- prometheus.MustNewConstMetric(descRetryBudget, prometheus.CounterValue, float64(rs.BudgetExhausted), route)
			ch <- prometheus.MustNewConstMetric(descRetryNotReplayable, prometheus.CounterValue, float64(rs.NotReplayable), route)
		}
		ch <- prometheus.MustNewConstMetric(descGlobalLimited, prometheus.CounterValue, float64(st.GlobalRateLimited))
		ch <- prometheus.MustNewConstMetric(descGlobalErrors, prometheus.CounterValue, float64(st.GlobalRateLimitErrors))
		collectTLSTunnels(ch, &st)
		collectHTTP2(ch, &st)
		collectConnections(ch, &st)
	}
}

// collectListener exports a listener agents dial into (reverse), labelled
// by its address.
func collectListener(ch chan<- prometheus.Metric, l *agentmux.ListenerStatus) {
	ch <- prometheus.MustNewConstMetric(descRevAccepted, prometheus.CounterValue, float64(l.Accepted), l.Address)
	for reason, n := range l.Rejected {
		ch <- prometheus.MustNewConstMetric(descRevRejected, prometheus.CounterValue, float64(n), l.Address, reason)
	}
	ch <- prometheus.MustNewConstMetric(descRevConns, prometheus.GaugeValue, float64(l.Pending), l.Address, "pending")
	ch <- prometheus.MustNewConstMetric(descRevConns, prometheus.GaugeValue, float64(l.Refusing), l.Address, "refusing")
	ch <- prometheus.MustNewConstMetric(descRevConns, prometheus.GaugeValue, float64(l.Active), l.Address, "active")
	ch <- prometheus.MustNewConstMetric(descRevDelayed, prometheus.CounterValue, float64(l.Delayed), l.Address)
	ch <- prometheus.MustNewConstMetric(descRevUnheld, prometheus.CounterValue, float64(l.Unheld), l.Address)
}

// lateCollector adds kind="late_reply" to sidecar_agent_errors_total from
// the agents' session counters. It is unchecked (it describes nothing)
// because the family's other kinds come from a registered CounterVec;
// the registry merges the two at gather time.
type lateCollector struct{ m *Metrics }

func (c *lateCollector) Describe(chan<- *prometheus.Desc) {}

func (c *lateCollector) Collect(ch chan<- prometheus.Metric) {
	f := c.m.agents.Load()
	if f == nil {
		return
	}
	for _, st := range (*f)() {
		ch <- prometheus.MustNewConstMetric(descLate, prometheus.CounterValue, float64(st.Late), st.Name, KindLateReply)
	}
}
