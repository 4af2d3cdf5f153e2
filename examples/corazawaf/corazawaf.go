// Package corazawaf is a web application firewall agent: it runs the
// Coraza engine with the OWASP Core Rule Set v4 (embedded in the binary,
// nothing is downloaded at run time) on request headers, request bodies
// and response headers.
//
// Each request gets one Coraza transaction, opened at its RequestHeaders
// and closed when the agent has given its last answer for it: a block, the
// request phase when responses are not inspected, or the response headers.
// A transaction is also closed when the proxy cancels its request
// (sdk.CancelObserver: a client gone, an upstream failure), when it waits
// longer than Config.PendingTTL for its next event (a CancelRequest is
// delivered on a best-effort basis), when more than Config.MaxPending
// wait, and by Close.
//
// The proxy waits for each answer only until the event's deadline (its
// timeout_ms), which ends the handler's context; so does a CancelRequest.
// A CRS phase cannot be stopped once it runs, so the handlers look at the
// context before each phase and before feeding a body chunk, and close
// the transaction there once it has ended: under an overload the CPU goes
// to requests the proxy still waits for. With an sdk.Limiter (the
// command's -handlers) a request waiting for a slot past its deadline is
// never evaluated at all.
//
// The agent declares request bodies, so the SDK negotiates inline bodies:
// configure the sidecar with request_body mode buffered for this agent,
// and a body of up to one chunk is inspected together with its headers in
// one round trip.
//
// In blocking mode a flagged request is answered with the rules' status
// (403) and a small JSON body that names one rule id, also in the
// x-waf-rule-id header; nothing else about the rules reaches the client.
// The decision's audit field carries the ids of every rule that matched
// on its side of the exchange (request or response), in the order they
// matched, CRS's blocking evaluation (949110, 959100) and, for the answer
// that ends the transaction, its anomaly score summary (980170) included,
// its silent bookkeeping rules not; bounded only by the protocol's list
// limit (protocol.MaxListEntries). It also carries the tags "waf" and
// "blocked" or "detected", and {"anomaly_score":N,...} as its custom
// value. The agent logs the same, at most Config.LogRate lines per
// second; a request whose answer never reached the proxy (its deadline
// passed, it was canceled, or the agent's own bounds or shutdown closed
// it) is logged with the action "unanswered", the reason, and whether
// the rules would have blocked it.
//
// Config.SetupDirectives go before the CRS rules, as CRS's crs-setup.conf
// does (SecAction setting tx.* variables, runtime exclusions),
// Config.ExtraDirectives after them (configure-time exclusions).
//
// The cost of a decision is Coraza evaluating the CRS rules; the agent's
// own work (the WAF and its rules are built once, in New; audit log,
// debug log and response bodies are off) adds about 30 allocations to
// Coraza's 3,400. BenchmarkDecision measures the agent, BenchmarkLibraryFloor
// Coraza alone on the same GET. One run on 2 shared CPUs (medians of 5
// rounds, CPU per request, request and response phases), with
// Config.RxPreFilter off then on: a GET with a query string 1.73 ms then
// 1.26 ms, a 61-byte form POST 2.72 then 1.74 ms, a blocked SQL injection
// 1.19 ms either way, a 4 KiB form body of one argument 40.3 then
// 24.7 ms; Coraza alone on the GET 1.75 then 1.47 ms (1.40 then 1.22 ms
// without the response phases, 0.3 ms for phase 1 alone). Go's regexp
// runs its slow NFA on long inputs: on the 4 KiB argument five RCE rules
// (932230, 932235, 932250, 932260, 932340) take about half the time.
package corazawaf

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	coreruleset "github.com/corazawaf/coraza-coreruleset/v4"
	coraza "github.com/corazawaf/coraza/v3"
	"github.com/corazawaf/coraza/v3/experimental/plugins/plugintypes"
	"github.com/corazawaf/coraza/v3/types"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// Errors of the agent.
var (
	// ErrRules: the rule set did not load (bad SetupDirectives or
	// ExtraDirectives, say).
	ErrRules = errors.New("corazawaf: rules")
	// ErrNoTransaction: a body chunk came for a request whose transaction
	// is gone (expired or evicted); the proxy's failure policy decides.
	ErrNoTransaction = errors.New("corazawaf: no transaction for request")
	// ErrClosed: the agent was closed.
	ErrClosed = errors.New("corazawaf: closed")
)

// Stats are the agent's counters since New.
type Stats struct {
	// Requests is the number of transactions opened.
	Requests uint64
	// Blocked and Detected count flagged requests or responses, blocked
	// (blocking mode) or let through (detection-only mode).
	Blocked, Detected uint64
	// Canceled: transactions closed because the proxy canceled their
	// request (CancelRequest) while the agent held or worked on it.
	Canceled uint64
	// TimedOut: transactions closed because their event's deadline (the
	// proxy's timeout_ms) passed while the agent worked on it: the agent
	// stops at the next phase instead of finishing for nobody.
	TimedOut uint64
	// Expired and Evicted: transactions closed by PendingTTL and MaxPending.
	Expired, Evicted uint64
	// Unmatched: response headers of a request without a transaction (it
	// expired or was evicted), passed uninspected.
	Unmatched uint64
	// LogSuppressed: request log lines dropped by the rate limit.
	LogSuppressed uint64
	// Open is the number of transactions open now.
	Open int64
}

type counters struct {
	requests, blocked, detected, canceled, timedOut, expired, evicted, unmatched atomic.Uint64
	open                                                                         atomic.Int64
}

// Handler is the agent. Create it with New; Close it when serving ended.
type Handler struct {
	cfg     Config
	waf     coraza.WAF
	log     *rateLog
	stats   counters
	pending *table
	closed  atomic.Bool
}

var (
	_ sdk.Handler        = (*Handler)(nil)
	_ sdk.CancelObserver = (*Handler)(nil)
)

// New loads the rule set for cfg. log receives one line per flagged
// request (rate-limited) and may be nil.
func New(cfg Config, log *zerolog.Logger) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	waf, err := coraza.NewWAF(coraza.NewWAFConfig().
		WithRootFS(coreruleset.FS).
		WithDirectives(Directives(&cfg)))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRules, err)
	}
	if log == nil {
		nop := zerolog.Nop()
		log = &nop
	}
	h := &Handler{cfg: cfg, waf: waf}
	h.log = newRateLog(*log, cfg.LogRate)
	h.pending = newTable(cfg.MaxPending, cfg.PendingTTL, &h.stats, h.unanswered)
	return h, nil
}

// The agent's own CRS settings (paranoia level, thresholds, methods,
// content types) are rules 900900 to 900903: ids in CRS's setup range
// that CRS's crs-setup.conf.example does not use, so that setup
// directives may use the ids it documents (900000 for the paranoia level,
// 900200 for the allowed methods, …) and, coming later, override them.
const (
	idParanoia     = 900900
	idThresholds   = 900901
	idMethods      = 900902
	idContentTypes = 900903
)

// Directives is the SecLang configuration New loads for cfg, in CRS's
// order: Coraza's recommended settings and the agent's overrides; the CRS
// setup (crs-setup.conf.example, the agent's settings from cfg, then
// cfg.SetupDirectives); the rules; the exclusions, then
// cfg.ExtraDirectives.
func Directives(cfg *Config) string {
	engine := "On"
	if cfg.Mode == ModeDetectionOnly {
		engine = "DetectionOnly"
	}
	var b strings.Builder
	fmt.Fprintf(&b, `Include @coraza.conf-recommended
SecRuleEngine %s
SecRequestBodyAccess On
SecRequestBodyLimit %d
SecRequestBodyInMemoryLimit %d
SecRequestBodyLimitAction Reject
SecResponseBodyAccess Off
SecAuditEngine Off
SecRxPreFilter %s
Include @crs-setup.conf.example
SecAction "id:%d,phase:1,pass,t:none,nolog,setvar:tx.blocking_paranoia_level=%d"
SecAction "id:%d,phase:1,pass,t:none,nolog,setvar:tx.inbound_anomaly_score_threshold=%d,setvar:tx.outbound_anomaly_score_threshold=%d"
SecAction "id:%d,phase:1,pass,t:none,nolog,setvar:'tx.allowed_methods=%s'"
%s`, engine, cfg.BodyLimit, cfg.BodyLimit, onOff(cfg.RxPreFilter),
		idParanoia, cfg.ParanoiaLevel, idThresholds, cfg.InboundThreshold, cfg.OutboundThreshold,
		idMethods, strings.Join(cfg.AllowedMethods, " "), contentTypes(cfg.AllowedContentTypes))
	if cfg.SetupDirectives != "" {
		// Before the rules, as crs-setup.conf: a SecAction here sets tx
		// variables before CRS's initialisation (901*) reads them.
		b.WriteString(cfg.SetupDirectives)
		b.WriteByte('\n')
	}
	b.WriteString("Include @owasp_crs/*.conf\n")
	for _, r := range cfg.Exclusions {
		fmt.Fprintf(&b, "SecRuleRemoveById %s\n", r)
	}
	if cfg.ExtraDirectives != "" {
		b.WriteString(cfg.ExtraDirectives)
		b.WriteByte('\n')
	}
	return b.String()
}

func onOff(b bool) string {
	if b {
		return "On"
	}
	return "Off"
}

// contentTypes is the directive that sets CRS's allowed request content
// types, or "" for CRS's own list.
func contentTypes(cts []string) string {
	if len(cts) == 0 {
		return ""
	}
	return `SecAction "id:` + strconv.Itoa(idContentTypes) + `,phase:1,pass,t:none,nolog,setvar:'tx.allowed_request_content_type=|` +
		strings.Join(cts, "| |") + `|'"` + "\n"
}

// Stats returns the agent's counters.
func (h *Handler) Stats() Stats {
	return Stats{
		Requests: h.stats.requests.Load(), Blocked: h.stats.blocked.Load(), Detected: h.stats.detected.Load(),
		Canceled: h.stats.canceled.Load(), TimedOut: h.stats.timedOut.Load(),
		Expired: h.stats.expired.Load(), Evicted: h.stats.evicted.Load(),
		Unmatched: h.stats.unmatched.Load(), LogSuppressed: h.log.suppressedTotal.Load(),
		Open: h.stats.open.Load(),
	}
}

// Pending is the number of transactions waiting for their next event.
func (h *Handler) Pending() int { return h.pending.len() }

// Close closes every open transaction; a handler still running closes its
// own when it returns. Call it after serving ended.
func (h *Handler) Close() error {
	h.closed.Store(true)
	h.pending.close()
	return nil
}

// Capabilities implements sdk.Handler: request headers and bodies, and
// response headers when InspectResponse is set.
func (h *Handler) Capabilities() protocol.Capabilities {
	return protocol.Capabilities{
		HandlesRequestHeaders:  true,
		HandlesRequestBody:     true,
		HandlesResponseHeaders: h.cfg.InspectResponse,
		SupportsCancellation:   true,
	}
}

// The handlers look at their context (gaveUp) before each CRS phase and
// before feeding a body chunk, as the package doc says: a transaction
// whose answer nobody waits for is closed there, its matches so far
// logged (unanswered), instead of running the rest of the rules.

// OnRequestHeaders implements sdk.Handler: open the transaction and run
// CRS phase 1; without a body, phase 2 as well (the query string's
// arguments are checked there).
func (h *Handler) OnRequestHeaders(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	if h.closed.Load() {
		return ErrClosed
	}
	// A verdict is about this request only (its query string, headers and
	// body): a proxy's decision cache keyed by path must not replay an
	// allow to an attack, nor a block to the next client.
	sdk.NoStore(d)
	if old := h.pending.take(m.RequestID); old != nil {
		closeEntry(old, &h.stats) // an id reused by another proxy
	}
	var tx types.Transaction
	if len(m.Metadata.CorrelationID) > 0 {
		tx = h.waf.NewTransactionWithID(string(m.Metadata.CorrelationID))
	} else {
		tx = h.waf.NewTransaction()
	}
	h.stats.requests.Add(1)
	h.stats.open.Add(1)
	e := &entry{id: m.RequestID, tx: tx, proto: protoName(m.Metadata.Protocol)}

	md := &m.Metadata
	tx.ProcessConnection(string(md.ClientIP), md.ClientPort, string(md.ServerIP), md.ServerPort)
	// The request line CRS checks is the client's: its target as sent
	// (absolute-form included) when the proxy shows the client's request
	// (client_request), as Coraza in front of a server sees it; the
	// origin-form uri otherwise.
	target := m.URI
	if len(m.RequestTarget) > 0 {
		target = m.RequestTarget
	}
	tx.ProcessURI(string(target), string(m.Method), e.proto)
	if len(md.ServerName) > 0 {
		tx.SetServerName(string(md.ServerName))
	}
	for _, hd := range m.Headers {
		tx.AddRequestHeader(string(hd.Name), string(hd.Value))
	}
	it := tx.ProcessRequestHeaders()
	if it == nil && !m.HasBody {
		if h.gaveUp(ctx, e) {
			return nil
		}
		it, _ = h.phase2(e)
	}
	return h.finishRequestEvent(ctx, e, it, d, !m.HasBody)
}

// OnRequestBody implements sdk.Handler: feed the chunk to the transaction;
// on the last one, run CRS phase 2 and decide.
func (h *Handler) OnRequestBody(ctx context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	e := h.pending.take(m.RequestID)
	if e == nil {
		if h.closed.Load() {
			return ErrClosed
		}
		return fmt.Errorf("%w %d", ErrNoTransaction, m.RequestID)
	}
	if h.gaveUp(ctx, e) {
		return nil
	}
	it, _, err := e.tx.WriteRequestBody(m.Data)
	if err != nil {
		closeEntry(e, &h.stats)
		return fmt.Errorf("corazawaf: request body: %w", err)
	}
	if it == nil && m.IsLast {
		if h.gaveUp(ctx, e) {
			return nil
		}
		it, err = h.phase2(e)
		if err != nil {
			// A body the processor cannot parse: CRS flags it through
			// REQBODY_ERROR (rule 200002), so this is an I/O error.
			closeEntry(e, &h.stats)
			return fmt.Errorf("corazawaf: request body: %w", err)
		}
	}
	if it == nil && !m.IsLast {
		if h.gaveUp(ctx, e) {
			return nil
		}
		h.pending.put(e, time.Now())
		r.NeedMore()
		return nil
	}
	return h.finishRequestEvent(ctx, e, it, &r.Decision, true)
}

func (h *Handler) phase2(e *entry) (*types.Interruption, error) {
	e.phase2 = true
	return e.tx.ProcessRequestBody()
}

// gaveUp reports whether ctx has ended (the event's deadline passed, or
// the proxy canceled the request); if so it closes e's transaction as
// unanswered.
func (h *Handler) gaveUp(ctx context.Context, e *entry) bool {
	err := ctx.Err()
	if err == nil {
		return false
	}
	reason := reasonCanceled
	if errors.Is(err, context.DeadlineExceeded) {
		reason = reasonTimeout
	}
	h.unanswered(e, reason)
	return true
}

// finishRequestEvent decides on a request event: block on an
// interruption, report detections, and keep the transaction when more
// events are expected. done says the request phase is over.
func (h *Handler) finishRequestEvent(ctx context.Context, e *entry, it *types.Interruption, d *protocol.Decision, done bool) error {
	if h.gaveUp(ctx, e) {
		// Nobody waits for the answer (Coraza ran past the deadline,
		// or the request was canceled meanwhile).
		return nil
	}
	if it != nil {
		h.block(e, it, d, sideRequest)
		closeEntry(e, &h.stats)
		return nil
	}
	if done {
		if !h.cfg.InspectResponse {
			e.logPhase() // the transaction ends with this answer
		}
		h.report(e, d, sideRequest)
		if !h.cfg.InspectResponse {
			closeEntry(e, &h.stats)
			return nil
		}
	}
	h.pending.put(e, time.Now())
	return nil
}

// OnResponseHeaders implements sdk.Handler: run CRS phases 3 and 4 (the
// outbound anomaly score) on the response headers, then close the
// transaction.
func (h *Handler) OnResponseHeaders(ctx context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
	e := h.pending.take(m.RequestID)
	if e == nil {
		h.stats.unmatched.Add(1)
		return nil
	}
	if !e.phase2 {
		// The body never came (the sidecar skipped it: over its limit with
		// over_limit: skip, or mode none): check the rest of the request
		// now, late as it is.
		if h.gaveUp(ctx, e) {
			return nil
		}
		if it, _ := h.phase2(e); it != nil {
			if h.gaveUp(ctx, e) {
				return nil
			}
			h.block(e, it, d, sideRequest)
			closeEntry(e, &h.stats)
			return nil
		}
		h.report(e, d, sideRequest)
	}
	e.response = true
	if h.gaveUp(ctx, e) {
		return nil
	}
	for _, hd := range m.Headers {
		e.tx.AddResponseHeader(string(hd.Name), string(hd.Value))
	}
	it := e.tx.ProcessResponseHeaders(m.StatusCode, e.proto)
	if it == nil {
		if h.gaveUp(ctx, e) {
			return nil
		}
		it, _ = e.tx.ProcessResponseBody()
	}
	if h.gaveUp(ctx, e) {
		return nil
	}
	defer closeEntry(e, &h.stats)
	e.logPhase() // the transaction ends with this answer
	if it != nil {
		h.block(e, it, d, sideResponse)
		return nil
	}
	if d.Audit.Empty() {
		h.report(e, d, sideResponse)
	}
	return nil
}

// OnCancel implements sdk.CancelObserver: the proxy gave up on the request
// (client gone, upstream failed, another agent decided, or the SDK
// dropped an event whose deadline passed): close its transaction now
// rather than at PendingTTL. One in use by a running handler is closed by
// that handler, whose context has ended.
func (h *Handler) OnCancel(id uint64) {
	if e := h.pending.take(id); e != nil {
		h.unanswered(e, reasonCanceled)
	}
}

// OnResponseBody implements sdk.Handler (not asked for).
func (h *Handler) OnResponseBody(_ context.Context, _ *protocol.BodyChunk, r *sdk.BodyReply) error {
	r.Pass()
	return nil
}

var (
	hdrRuleID      = []byte("x-waf-rule-id")
	hdrContentType = []byte("content-type")
	valJSON        = []byte("application/json")
	tagWAF         = []byte("waf")
	tagBlocked     = []byte("blocked")
	tagDetected    = []byte("detected")
)

// Sides of a transaction: the request's phases (1, 2) and the response's
// (3, 4); a decision reports the matches of its side, and of the logging
// phase (5) when the transaction ends with it.
const (
	sideRequest  = "request"
	sideResponse = "response"
)

// Why a transaction was closed without its answer reaching the proxy.
const (
	reasonTimeout  = "timeout"  // the event's deadline passed
	reasonCanceled = "canceled" // the proxy canceled the request
	reasonExpired  = "expired"  // PendingTTL
	reasonEvicted  = "evicted"  // MaxPending
	reasonShutdown = "shutdown" // Close
)

// block answers the client with the interruption's status, naming one rule.
func (h *Handler) block(e *entry, it *types.Interruption, d *protocol.Decision, side string) {
	e.logPhase() // the transaction ends with this answer
	mt := h.matched(e.tx, side)
	first := mt.first
	if first == 0 {
		first = it.RuleID
	}
	status := it.Status
	if status < 400 || status > 599 {
		status = 403
	}
	rid := strconv.Itoa(first)
	d.Kind = protocol.DecisionBlock
	d.Status = status
	d.Body = []byte(`{"error":"request blocked by the web application firewall","rule_id":` + rid + "}\n")
	d.BlockHeaders = d.BlockHeaders.Add(hdrContentType, valJSON).Add(hdrRuleID, []byte(rid))
	h.audit(d, mt, tagBlocked, side)
	h.stats.blocked.Add(1)
	h.log.log(e, "blocked", side, status, "", mt)
}

// report fills the audit of a request the rules flagged without an
// interruption: detection-only mode, or a score under the threshold.
func (h *Handler) report(e *entry, d *protocol.Decision, side string) {
	mt := h.matched(e.tx, side)
	if !mt.flagged {
		return
	}
	h.audit(d, mt, tagDetected, side)
	h.stats.detected.Add(1)
	h.log.log(e, "detected", side, 0, "", mt)
}

// unanswered closes e's transaction when its answer will never reach the
// proxy (reason: why) and logs what the rules found so far, flagged
// (action "unanswered", the reason, and whether it would have blocked):
// a request the proxy gave up on may still have been an attack, which its
// failure policy let through (fail open) or refused (fail closed).
func (h *Handler) unanswered(e *entry, reason string) {
	switch reason {
	case reasonTimeout:
		h.stats.timedOut.Add(1)
	case reasonCanceled:
		h.stats.canceled.Add(1)
	}
	e.logPhase()
	side := sideRequest
	if e.response {
		side = sideResponse
	}
	mt := h.matched(e.tx, side)
	if mt.flagged || e.tx.IsInterrupted() {
		mt.interrupted = e.tx.IsInterrupted()
		h.log.log(e, "unanswered", side, 0, reason, mt)
	}
	closeEntry(e, &h.stats)
}

func (h *Handler) audit(d *protocol.Decision, mt matches, tag []byte, side string) {
	a := &d.Audit
	a.Tags = append(a.Tags, tagWAF, tag)
	for _, id := range mt.ids {
		a.RuleIDs = append(a.RuleIDs, strconv.AppendInt(nil, int64(id), 10))
	}
	a.Custom = fmt.Appendf(nil, `{"anomaly_score":%d,"phase":%q,"mode":%q,"paranoia_level":%d}`,
		mt.score, side, h.cfg.Mode, h.cfg.ParanoiaLevel)
}

// matches is what the rules found on one side of a transaction.
type matches struct {
	// ids are the matched rules of the side, in the order they matched:
	// every one that logs, so CRS's blocking evaluation (949110, 959100)
	// too, and its anomaly score summary (980170, which has a message but
	// which Coraza does not mark as logging: a phase 5 SecAction gets no
	// default action) once the logging phase ran; not its nolog
	// bookkeeping (initialisation, paranoia-level skips), which matches
	// on every request. At most protocol.MaxListEntries, the protocol's
	// limit on one list (CRS has about 700 rules).
	ids []int
	// first is the rule shown to the client: the first critical rule
	// that scores, else the first that scores.
	first int
	// flagged: a rule that scores (one with a severity, other than the
	// evaluation rules restating the score) matched.
	flagged bool
	// score is the side's blocking anomaly score.
	score int
	// interrupted: the rules decided to block (for an unanswered one).
	interrupted bool
}

// matched returns what the rules found on side of tx.
func (h *Handler) matched(tx types.Transaction, side string) matches {
	var mt matches
	crit := 0
	all := tx.MatchedRules()
	var seen map[int]bool
	if len(all) > 64 {
		seen = make(map[int]bool, len(all))
	}
	for _, mr := range all {
		r := mr.Rule()
		ph := r.Phase()
		if ph != types.PhaseLogging && (ph >= types.PhaseResponseHeaders) != (side == sideResponse) {
			continue
		}
		if l, ok := mr.(interface{ Log() bool }); !ok || l.Log() || scoringEvaluation(r.ID()) && mr.Message() != "" {
			id := r.ID()
			dup := false
			if seen != nil {
				dup = seen[id]
				seen[id] = true
			} else {
				dup = slices.Contains(mt.ids, id)
			}
			if !dup && len(mt.ids) < protocol.MaxListEntries {
				mt.ids = append(mt.ids, id)
			}
		}
		if r.Severity() == types.RuleSeverityUnset || scoringEvaluation(r.ID()) {
			continue
		}
		mt.flagged = true
		if mt.first == 0 {
			mt.first = r.ID()
		}
		if crit == 0 && r.Severity() == types.RuleSeverityCritical {
			crit = r.ID()
		}
	}
	if crit != 0 {
		mt.first = crit
	}
	if ts, ok := tx.(plugintypes.TransactionState); ok {
		key := "blocking_inbound_anomaly_score"
		if side == sideResponse {
			key = "blocking_outbound_anomaly_score"
		}
		if v := ts.Variables().TX().Get(key); len(v) > 0 {
			mt.score, _ = strconv.Atoi(v[0])
		}
	}
	return mt
}

// scoringEvaluation reports CRS's blocking evaluation and correlation
// rules, which restate the score rather than match the request.
func scoringEvaluation(id int) bool {
	return id >= 949000 && id < 950000 || id >= 959000 && id < 960000 || id >= 980000 && id < 981000
}

// protoName is the HTTP version as Coraza's REQUEST_PROTOCOL wants it.
func protoName(p []byte) string {
	switch string(p) {
	case "", "HTTP/1.1":
		return "HTTP/1.1"
	case "HTTP/1.0":
		return "HTTP/1.0"
	case "HTTP/2", "HTTP/2.0":
		return "HTTP/2.0"
	}
	return string(p)
}
