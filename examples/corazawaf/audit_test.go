package corazawaf

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/protocol"
)

// loggedHandler is New with a log kept in buf.
func loggedHandler(t *testing.T, cfg Config) (*Handler, *bytes.Buffer) {
	t.Helper()
	var buf bytes.Buffer
	zl := zerolog.New(&buf)
	h, err := New(cfg, &zl)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.Close() })
	return h, &buf
}

// logLines returns the "waf match" lines of buf, decoded.
func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		if m["message"] == "waf match" {
			out = append(out, m)
		}
	}
	return out
}

func loggedIDs(line map[string]any) []string {
	var ids []string
	for _, v := range line["rule_ids"].([]any) {
		ids = append(ids, fmt.Sprint(v))
	}
	return ids
}

func ruleIDs(d *protocol.Decision) []string {
	var ids []string
	for _, b := range d.Audit.RuleIDs {
		ids = append(ids, string(b))
	}
	return ids
}

// TestAuditCarriesEveryMatchedRule: a request the anomaly threshold blocks
// reports, in the decision's audit and the log, the rule that matched
// (942100), CRS's blocking evaluation (949110) and its correlation rule
// (980170); the client is shown the rule that caused the block.
func TestAuditCarriesEveryMatchedRule(t *testing.T) {
	h, buf := loggedHandler(t, DefaultConfig())
	d, _ := exchange(t, h, 1, "/products?id=1%27%20OR%20%271%27%3D%271", nil, 0)
	if d.Kind != protocol.DecisionBlock {
		t.Fatalf("decision %s", d.Kind)
	}
	if got := string(d.BlockHeaders.Get("x-waf-rule-id")); got != "942100" {
		t.Errorf("client sees rule %q, want 942100", got)
	}
	ids := ruleIDs(d)
	for _, want := range []string{"942100", "949110", "980170"} {
		if !slices.Contains(ids, want) {
			t.Errorf("audit rule_ids %v lack %s", ids, want)
		}
	}
	// CRS's nolog bookkeeping (initialisation, paranoia-level skips) is
	// not a match.
	for _, id := range ids {
		if strings.HasPrefix(id, "901") || id == "949011" {
			t.Errorf("audit rule_ids %v carry the bookkeeping rule %s", ids, id)
		}
	}
	lines := logLines(t, buf)
	if len(lines) != 1 || !slices.Contains(loggedIDs(lines[0]), "949110") {
		t.Fatalf("log %v: want one line with 949110", lines)
	}
}

// TestAuditRuleIDsUnbounded: the audit is not cut at a few dozen ids; 40
// matching rules of the operator's own are all reported.
func TestAuditRuleIDsUnbounded(t *testing.T) {
	cfg := DefaultConfig()
	var rules strings.Builder
	for i := range 40 {
		fmt.Fprintf(&rules, "SecRule REQUEST_URI \"@beginsWith /many\" \"id:%d,phase:1,pass,log,severity:'NOTICE'\"\n", 10000+i)
	}
	cfg.ExtraDirectives = rules.String()
	h, _ := loggedHandler(t, cfg)
	d, _ := exchange(t, h, 1, "/many", nil, 0)
	ids := ruleIDs(d)
	for i := range 40 {
		if !slices.Contains(ids, fmt.Sprint(10000+i)) {
			t.Fatalf("audit rule_ids (%d) lack %d: %v", len(ids), 10000+i, ids)
		}
	}
}

// endsAfter is a context whose Err says context.DeadlineExceeded from its
// n-th call on: the event's deadline passing while the rules run.
type endsAfter struct {
	context.Context
	n     int32
	calls atomic.Int32
}

func (c *endsAfter) Err() error {
	if c.calls.Add(1) >= c.n {
		return context.DeadlineExceeded
	}
	return nil
}

// TestUnansweredMatchesLogged: a request whose answer never reaches the
// proxy still has what the rules found logged, flagged as unanswered
// with the reason: its deadline passed while Coraza ran (it would have
// been blocked), or the proxy canceled it between events.
func TestUnansweredMatchesLogged(t *testing.T) {
	h, buf := loggedHandler(t, DefaultConfig())
	// The deadline passes during phase 2: checked before it (call 1),
	// found at the answer (call 2).
	ctx := &endsAfter{Context: context.Background(), n: 2}
	d := new(protocol.Decision)
	if err := h.OnRequestHeaders(ctx, reqHeaders(1, "GET", "/products?id=1%27%20OR%20%271%27%3D%271", false), d); err != nil {
		t.Fatal(err)
	}
	if d.Kind != protocol.DecisionAllow || !d.Audit.Empty() {
		t.Errorf("an answer was filled for an unanswered request: %s %q", d.Kind, ruleIDs(d))
	}
	// Canceled between its headers and its body.
	scanner := reqHeaders(2, "POST", "/form", true, "content-type", "application/x-www-form-urlencoded")
	scanner.Headers = append(scanner.Headers, protocol.Header{Name: []byte("user-agent"), Value: []byte("sqlmap/1.7.2#stable (https://sqlmap.org)")})
	if err := h.OnRequestHeaders(context.Background(), scanner, new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	h.OnCancel(2)

	lines := logLines(t, buf)
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2: %s", len(lines), buf)
	}
	want := []struct {
		reason, rule string
		block        bool
	}{{"timeout", "942100", true}, {"canceled", "913100", false}}
	for i, w := range want {
		l := lines[i]
		if l["action"] != "unanswered" || l["reason"] != w.reason || l["would_block"] != w.block || !slices.Contains(loggedIDs(l), w.rule) {
			t.Errorf("line %d: %v; want action unanswered, reason %s, would_block %v, rule %s", i, l, w.reason, w.block, w.rule)
		}
	}
	if s := h.Stats(); s.TimedOut != 1 || s.Canceled != 1 || s.Blocked != 0 || s.Open != 0 {
		t.Errorf("stats %+v", s)
	}
}

// TestStopsBetweenPhases: a handler whose context has ended does not run
// the next CRS phase: the request's phase 2 rule never matches, and what
// phase 1 found is logged as unanswered.
func TestStopsBetweenPhases(t *testing.T) {
	cfg := DefaultConfig()
	cfg.ExtraDirectives = `SecAction "id:10001,phase:2,pass,log,severity:'CRITICAL'"` + "\n" +
		`SecAction "id:10002,phase:3,pass,log,severity:'CRITICAL'"`
	h, buf := loggedHandler(t, cfg)
	ua := protocol.Header{Name: []byte("user-agent"), Value: []byte("sqlmap/1.7.2#stable (https://sqlmap.org)")}

	expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	m := reqHeaders(1, "GET", "/", false)
	m.Headers = append(m.Headers, ua)
	if err := h.OnRequestHeaders(expired, m, new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}
	// The response phases: the request went through, then the deadline
	// of the response headers passed before phase 3.
	m = reqHeaders(2, "GET", "/", false)
	d := new(protocol.Decision)
	if err := h.OnRequestHeaders(context.Background(), m, d); err != nil || d.Kind != protocol.DecisionAllow {
		t.Fatalf("request 2: %v %s", err, d.Kind)
	}
	if err := h.OnResponseHeaders(expired, respHeaders(2, 200), new(protocol.Decision)); err != nil {
		t.Fatal(err)
	}

	// Request 1: phase 1 found the scanner, phase 2 did not run.
	// Request 2: its request phase matched 10001 (reported with its
	// answer); its response phase stopped before phase 3 (10002), and
	// with nothing found there, logs nothing more.
	lines := logLines(t, buf)
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 2: %s", len(lines), buf)
	}
	if l := lines[0]; l["request_id"] != 1.0 || l["reason"] != "timeout" || !slices.Contains(loggedIDs(l), "913100") ||
		slices.Contains(loggedIDs(l), "10001") {
		t.Errorf("request 1: %v; want its 913100 unanswered for its timeout, and no phase 2 rule", l)
	}
	if l := lines[1]; l["request_id"] != 2.0 || l["action"] != "detected" || !slices.Equal(loggedIDs(l), []string{"10001"}) {
		t.Errorf("request 2: %v; want its request phase's 10001 detected", l)
	}
	if s := h.Stats(); s.TimedOut != 2 || s.Open != 0 {
		t.Errorf("stats %+v: want 2 timed out, none open", s)
	}
}

// method runs one bodiless request with method through h and returns the
// request decision.
func method(t *testing.T, h *Handler, id uint64, m string) *protocol.Decision {
	t.Helper()
	d := new(protocol.Decision)
	if err := h.OnRequestHeaders(context.Background(), reqHeaders(id, m, "/items/7", false), d); err != nil {
		t.Fatal(err)
	}
	if d.Kind == protocol.DecisionAllow && h.cfg.InspectResponse {
		if err := h.OnResponseHeaders(context.Background(), respHeaders(id, 200), new(protocol.Decision)); err != nil {
			t.Fatal(err)
		}
	}
	return d
}

// TestSetupDirectivesBeforeRules: a SecAction of the setup directives
// sets a CRS variable before the rules read it, and wins over the
// agent's own setting of it: DELETE, allowed by the default
// AllowedMethods, is refused by 911100 once tx.allowed_methods leaves it
// out (with the id crs-setup.conf.example documents for it). The same
// SecAction after the rules comes too late to change anything.
func TestSetupDirectivesBeforeRules(t *testing.T) {
	const setAllowed = `SecAction "id:900200,phase:1,pass,t:none,nolog,setvar:'tx.allowed_methods=GET HEAD POST OPTIONS'"`
	cfg := DefaultConfig()
	if d := method(t, newHandler(t, cfg), 1, "DELETE"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("DELETE with the default methods: %s", d.Kind)
	}
	cfg.SetupDirectives = setAllowed
	h := newHandler(t, cfg)
	d := method(t, h, 1, "DELETE")
	if d.Kind != protocol.DecisionBlock || string(d.BlockHeaders.Get("x-waf-rule-id")) != "911100" {
		t.Fatalf("DELETE once the setup leaves it out: %s rule %q, want a block by 911100", d.Kind, d.BlockHeaders.Get("x-waf-rule-id"))
	}
	if d := method(t, h, 2, "GET"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("GET: %s", d.Kind)
	}
	cfg.SetupDirectives = ""
	cfg.ExtraDirectives = strings.Replace(setAllowed, "900200", "10200", 1)
	if d := method(t, newHandler(t, cfg), 1, "DELETE"); d.Kind != protocol.DecisionAllow {
		t.Fatalf("the same SecAction after the rules: %s, want no effect", d.Kind)
	}
}

// TestExtraDirectivesAfterRules: a rule exclusion among the directives
// after the rules removes the rule: the scanner user agent 913100 alone
// blocks otherwise.
func TestExtraDirectivesAfterRules(t *testing.T) {
	scanner := func(h *Handler) *protocol.Decision {
		m := reqHeaders(1, "GET", "/", false)
		m.Headers = append(m.Headers, protocol.Header{Name: []byte("user-agent"), Value: []byte("sqlmap/1.7.2#stable (https://sqlmap.org)")})
		d := new(protocol.Decision)
		if err := h.OnRequestHeaders(context.Background(), m, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	cfg := DefaultConfig()
	if d := scanner(newHandler(t, cfg)); d.Kind != protocol.DecisionBlock {
		t.Fatalf("scanner: %s, want block", d.Kind)
	}
	cfg.ExtraDirectives = "# scanners are expected here\nSecRuleRemoveById 913100\n"
	if d := scanner(newHandler(t, cfg)); d.Kind != protocol.DecisionAllow {
		t.Fatalf("scanner with 913100 removed: %s %q", d.Kind, ruleIDs(d))
	}
}

// TestDirectivesErrors: a directive Coraza refuses fails New with
// ErrRules; a directives file over the limit, or not UTF-8, is refused
// with ErrConfig before it is read whole.
func TestDirectivesErrors(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SetupDirectives = "SecBogus On"
	if _, err := New(cfg, nil); !errors.Is(err, ErrRules) || !strings.Contains(err.Error(), "secbogus") {
		t.Errorf("bad setup directive: %v", err)
	}
	cfg.SetupDirectives = `SecAction "id:900990,phase:1,pass,nolog"` // crs-setup.conf.example's
	if _, err := New(cfg, nil); !errors.Is(err, ErrRules) {
		t.Errorf("a rule id crs-setup.conf.example sets: %v", err)
	}
	dir := t.TempDir()
	for name, content := range map[string][]byte{
		"big.conf":   bytes.Repeat([]byte("#"), MaxDirectivesFile+1),
		"latin.conf": []byte("SecAction \"id:1,phase:1,pass,msg:'caf\xe9'\"\n"),
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadDirectivesFile(p); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	if _, err := ReadDirectivesFile(filepath.Join(dir, "missing.conf")); !errors.Is(err, ErrConfig) {
		t.Errorf("missing file: %v", err)
	}
	p := filepath.Join(dir, "ok.conf")
	if err := os.WriteFile(p, []byte("SecRuleRemoveById 920350\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := ReadDirectivesFile(p); err != nil || s != "SecRuleRemoveById 920350\n" {
		t.Errorf("ok.conf: %q, %v", s, err)
	}
}
