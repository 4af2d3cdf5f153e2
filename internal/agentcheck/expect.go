package agentcheck

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Limits of an expectations file: it is the author's own file, but a
// decoder must bound what it accepts.
const (
	// MaxExpectationsBytes bounds the file.
	MaxExpectationsBytes = 1 << 20
	// MaxExpectationCases bounds the number of cases.
	MaxExpectationCases = 1000
)

// Expectations are the decisions an agent's author expects for given
// requests, so that agent-check tests the policy, not only the protocol:
//
//	expectations:
//	  - name: admin is blocked
//	    request: {method: GET, uri: /admin/users}
//	    expect: {decision: block, status: 403, block_headers: [{name: x-blocked-by}]}
//	  - name: pages get the demo header
//	    request: {uri: /, headers: {user-agent: curl/8.5.0}}
//	    expect:
//	      decision: allow
//	      request_headers: [{name: x-demo, value: "1"}, {name: x-client-class, value: cli}]
type Expectations struct {
	Cases []ExpectCase `yaml:"expectations"`
}

// ExpectCase is one request and the outcome expected.
type ExpectCase struct {
	Name     string          `yaml:"name"`
	Request  ExpectRequest   `yaml:"request"`
	Response *ExpectResponse `yaml:"response"`
	Expect   ExpectOutcome   `yaml:"expect"`

	line int
}

// ExpectRequest is the request shown to the agent.
type ExpectRequest struct {
	Method  string            `yaml:"method"` // default GET (POST with a body)
	URI     string            `yaml:"uri"`
	Headers map[string]string `yaml:"headers"`
	// Body is sent as request body chunks to an agent that handles them.
	Body string `yaml:"body"`
}

// ExpectResponse is the upstream's response shown to the agent when the
// request is allowed (for agents that handle the response phase).
type ExpectResponse struct {
	Status  int               `yaml:"status"` // default 200
	Headers map[string]string `yaml:"headers"`
	Body    string            `yaml:"body"`
}

// ExpectOutcome is what the agent should decide.
type ExpectOutcome struct {
	// Decision is allow, block or redirect.
	Decision string `yaml:"decision"`
	// Status of a block or redirect (0: not checked).
	Status int `yaml:"status"`
	// Location of a redirect ("": not checked).
	Location string `yaml:"location"`
	// RequestHeaders and ResponseHeaders are header operations that must
	// be among the agent's (over all its replies).
	RequestHeaders  []ExpectHeader `yaml:"request_headers"`
	ResponseHeaders []ExpectHeader `yaml:"response_headers"`
	// BlockHeaders must be among a block's response headers.
	BlockHeaders []ExpectHeader `yaml:"block_headers"`
	// ResponseBody, when set, is the response body the client would get
	// after the agent's body mutations.
	ResponseBody *string `yaml:"response_body"`
}

// ExpectHeader is one header (operation) expected; empty Value and Op are
// not checked.
type ExpectHeader struct {
	Name  string  `yaml:"name"`
	Value *string `yaml:"value"`
	Op    string  `yaml:"op"` // set, add or remove
}

// LoadExpectations reads and validates an expectations file.
func LoadExpectations(path string) (*Expectations, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrExpectations, err)
	}
	defer func() { _ = f.Close() }()
	b, err := io.ReadAll(io.LimitReader(f, MaxExpectationsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrExpectations, path, err)
	}
	x, err := ParseExpectations(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}

// ParseExpectations decodes an expectations file (YAML; unknown keys are
// errors) and validates it.
func ParseExpectations(b []byte) (*Expectations, error) {
	if len(b) > MaxExpectationsBytes {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrExpectations, MaxExpectationsBytes)
	}
	var x Expectations
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&x); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty file", ErrExpectations)
		}
		return nil, fmt.Errorf("%w: %v", ErrExpectations, err)
	}
	// The lines of the cases, for the messages below.
	var doc struct {
		Cases []yaml.Node `yaml:"expectations"`
	}
	if yaml.Unmarshal(b, &doc) == nil && len(doc.Cases) == len(x.Cases) {
		for i := range x.Cases {
			x.Cases[i].line = doc.Cases[i].Line
		}
	}
	if len(x.Cases) == 0 {
		return nil, fmt.Errorf("%w: no expectations", ErrExpectations)
	}
	if len(x.Cases) > MaxExpectationCases {
		return nil, fmt.Errorf("%w: %d cases, at most %d", ErrExpectations, len(x.Cases), MaxExpectationCases)
	}
	seen := map[string]bool{}
	for i := range x.Cases {
		c := &x.Cases[i]
		if err := c.validate(); err != nil {
			return nil, fmt.Errorf("%w: line %d: expectation %q: %v", ErrExpectations, c.line, c.Name, err)
		}
		if seen[c.Name] {
			return nil, fmt.Errorf("%w: line %d: expectation name %q used twice", ErrExpectations, c.line, c.Name)
		}
		seen[c.Name] = true
	}
	return &x, nil
}

func (c *ExpectCase) validate() error {
	switch {
	case c.Name == "":
		return errors.New("name is required")
	case !strings.HasPrefix(c.Request.URI, "/"):
		return fmt.Errorf("request.uri %q must start with /", c.Request.URI)
	case strings.ContainsAny(c.Request.Method, " \r\n\t"):
		return fmt.Errorf("request.method %q is not a method", c.Request.Method)
	}
	for k, v := range c.Request.Headers {
		if k == "" || strings.ContainsAny(k+v, "\r\n\x00") {
			return fmt.Errorf("request.headers %q: empty name or CR, LF or NUL", k)
		}
	}
	if c.Response != nil && c.Response.Status != 0 && (c.Response.Status < 100 || c.Response.Status > 599) {
		return fmt.Errorf("response.status %d is not 100–599", c.Response.Status)
	}
	o := &c.Expect
	switch strings.ToLower(o.Decision) {
	case "allow", "block", "redirect":
	default:
		return fmt.Errorf("expect.decision %q is not allow, block or redirect", o.Decision)
	}
	if o.Status != 0 && (o.Status < 100 || o.Status > 599) {
		return fmt.Errorf("expect.status %d is not 100–599", o.Status)
	}
	if o.ResponseBody != nil && c.Response == nil {
		return errors.New("expect.response_body needs a response")
	}
	for _, hs := range [][]ExpectHeader{o.RequestHeaders, o.ResponseHeaders, o.BlockHeaders} {
		for _, h := range hs {
			if h.Name == "" {
				return errors.New("a header without a name")
			}
			switch strings.ToLower(h.Op) {
			case "", "set", "add", "remove":
			default:
				return fmt.Errorf("header %q: op %q is not set, add or remove", h.Name, h.Op)
			}
		}
	}
	return nil
}

// outcome is what the agent decided over a whole exchange.
type outcome struct {
	kind           protocol.DecisionKind
	status         int
	location       string
	reqOps, resOps []protocol.HeaderOp
	blockHeaders   protocol.Headers
	body           []byte
	evidence       []string
}

// exchange runs c through the agent as the proxy would.
func (c *ExpectCase) exchange(d *dispatcher, caps protocol.Capabilities, timeout time.Duration) (*outcome, error) {
	o := &outcome{kind: protocol.DecisionAllow}
	id := nextID()
	rt := func(m protocol.Message) (*reply, error) {
		r, err := d.roundTrip(m, id, timeout)
		if r != nil {
			o.evidence = append(o.evidence, r.Ev())
		}
		if err != nil {
			return nil, err
		}
		if r.Dec != nil {
			o.reqOps = append(o.reqOps, r.Dec.RequestHeaderOps...)
			o.resOps = append(o.resOps, r.Dec.ResponseHeaderOps...)
			if r.Dec.Kind == protocol.DecisionBlock || r.Dec.Kind == protocol.DecisionRedirect {
				o.kind, o.status, o.location, o.blockHeaders = r.Dec.Kind, r.Dec.Status, string(r.Dec.RedirectURL), r.Dec.BlockHeaders
			}
		}
		return r, nil
	}
	stopped := func() bool { return o.kind != protocol.DecisionAllow }
	method := c.Request.Method
	if method == "" {
		method = "GET"
		if c.Request.Body != "" {
			method = "POST"
		}
	}
	hasBody := c.Request.Body != ""
	if caps.HandlesRequestHeaders {
		m := reqHeaders(id, method, c.Request.URI, hasBody)
		// The case's headers replace the defaults of the same name.
		for k, v := range c.Request.Headers {
			name := strings.ToLower(k)
			m.Headers = slices.DeleteFunc(m.Headers, func(h protocol.Header) bool { return string(h.Name) == name })
			m.Headers = append(m.Headers, protocol.Header{Name: []byte(name), Value: []byte(v)})
		}
		if _, err := rt(m); err != nil || stopped() {
			return o, err
		}
	}
	// body sends data in chunks of up to 16 bytes, so that multi-chunk
	// handling is exercised; it returns what is forwarded.
	body := func(phase protocol.Phase, data []byte) ([]byte, error) {
		var out []byte
		say := true
		n := max(1, (len(data)+15)/16)
		for k := 0; k < n; k++ {
			part := data[min(k*16, len(data)):min((k+1)*16, len(data))]
			if !say {
				out = append(out, part...)
				continue
			}
			last := k == n-1
			var m protocol.Message = reqChunk(id, uint32(k), part, last)
			if phase == protocol.PhaseResponse {
				m = respChunk(id, uint32(k), part, last)
			}
			r, err := rt(m)
			if err != nil || stopped() {
				return out, err
			}
			mut := r.Mut
			if r.Dec != nil {
				if phase == protocol.PhaseRequest && r.Dec.HasRequestBodyMutation {
					mut = &r.Dec.RequestBodyMutation
				} else if phase == protocol.PhaseResponse && r.Dec.HasResponseBodyMutation {
					mut = &r.Dec.ResponseBodyMutation
				}
				say = !r.Dec.Final()
			}
			switch {
			case mut == nil || mut.Action == protocol.MutationPass:
				out = append(out, part...)
			case mut.Action == protocol.MutationReplace:
				out = append(out, mut.Data...)
			}
		}
		return out, nil
	}
	if hasBody && caps.HandlesRequestBody {
		if _, err := body(protocol.PhaseRequest, []byte(c.Request.Body)); err != nil || stopped() {
			return o, err
		}
	}
	if c.Response == nil {
		return o, nil
	}
	o.body = []byte(c.Response.Body)
	if caps.HandlesResponseHeaders {
		st := c.Response.Status
		if st == 0 {
			st = 200
		}
		m := &protocol.ResponseHeaders{RequestID: id, StatusCode: st, HasBody: c.Response.Body != ""}
		for k, v := range c.Response.Headers {
			m.Headers = append(m.Headers, protocol.Header{Name: []byte(strings.ToLower(k)), Value: []byte(v)})
		}
		if _, err := rt(m); err != nil || stopped() {
			return o, err
		}
	}
	if c.Response.Body != "" && caps.HandlesResponseBody {
		out, err := body(protocol.PhaseResponse, []byte(c.Response.Body))
		if err != nil {
			return o, err
		}
		o.body = out
	}
	return o, nil
}

func hasHeaderOp(ops []protocol.HeaderOp, h ExpectHeader) bool {
	for _, op := range ops {
		if !strings.EqualFold(string(op.Name), h.Name) {
			continue
		}
		if h.Op != "" && !strings.EqualFold(op.Op.String(), h.Op) {
			continue
		}
		if h.Value != nil && string(op.Value) != *h.Value {
			continue
		}
		return true
	}
	return false
}

func hasHeader(hs protocol.Headers, h ExpectHeader) bool {
	for _, x := range hs {
		if strings.EqualFold(string(x.Name), h.Name) && (h.Value == nil || string(x.Value) == *h.Value) {
			return true
		}
	}
	return false
}

func fmtHeader(h ExpectHeader) string {
	s := h.Name
	if h.Op != "" {
		s = h.Op + " " + s
	}
	if h.Value != nil {
		s += ": " + *h.Value
	}
	return s
}

// judge compares what the agent did with what the case expects.
func (c *ExpectCase) judge(o *outcome) []string {
	var bad []string
	x := &c.Expect
	if !strings.EqualFold(o.kind.String(), x.Decision) {
		bad = append(bad, fmt.Sprintf("decision %s, expected %s", o.kind, strings.ToLower(x.Decision)))
		return bad
	}
	if x.Status != 0 && o.status != x.Status {
		bad = append(bad, fmt.Sprintf("status %d, expected %d", o.status, x.Status))
	}
	if x.Location != "" && o.location != x.Location {
		bad = append(bad, fmt.Sprintf("location %q, expected %q", o.location, x.Location))
	}
	for _, h := range x.RequestHeaders {
		if !hasHeaderOp(o.reqOps, h) {
			bad = append(bad, "no request header operation "+fmtHeader(h))
		}
	}
	for _, h := range x.ResponseHeaders {
		if !hasHeaderOp(o.resOps, h) {
			bad = append(bad, "no response header operation "+fmtHeader(h))
		}
	}
	for _, h := range x.BlockHeaders {
		if !hasHeader(o.blockHeaders, h) {
			bad = append(bad, "no block header "+fmtHeader(h))
		}
	}
	if x.ResponseBody != nil && string(o.body) != *x.ResponseBody {
		bad = append(bad, fmt.Sprintf("response body %q, expected %q", o.body, *x.ResponseBody))
	}
	return bad
}

func (e *env) runExpectations(x *Expectations) {
	l, err := e.open()
	if err != nil {
		e.report.Results = append(e.report.Results, Result{ID: "expect", Title: "expectations", Status: Fail, Detail: err.Error()})
		return
	}
	defer e.release(l, true)
	d := newDispatcher(l)
	for i := range x.Cases {
		c := &x.Cases[i]
		r := Result{ID: "expect:" + c.Name, Title: fmt.Sprintf("%s %s → %s", orGET(c.Request.Method), c.Request.URI, strings.ToLower(c.Expect.Decision)),
			Status: Pass, Rule: fmt.Sprintf("expectations line %d", c.line)}
		o, err := c.exchange(d, l.Caps(), e.cfg.Timeout)
		if o != nil {
			r.Received = o.evidence
		}
		switch {
		case err != nil:
			worse(&r, Fail, "%v", err)
		default:
			if bad := c.judge(o); len(bad) > 0 {
				worse(&r, Fail, "%s", strings.Join(bad, "; "))
			} else {
				note(&r, "as expected")
			}
		}
		e.strays.judge(&r)
		e.report.Results = append(e.report.Results, r)
	}
}

func orGET(m string) string {
	if m == "" {
		return "GET"
	}
	return m
}
