package extproc_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"text/template"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil/dptest"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

const e2eConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: proc
    transport: ext_proc
    address: {{.Proc}}
    failure_mode: {{or .Failure "closed"}}{{if .Status}}
    failure_status: {{.Status}}{{end}}
    timeouts:
      message: {{or .Message "5s"}}
    request_body:
      chunk_size: {{or .Chunk "64KiB"}}
    response_body:
      chunk_size: {{or .Chunk "64KiB"}}
    options:
      processing_mode: "{{.Mode}}"
routes:
  - name: main
    upstream: app
    agents: [proc]
`

// seen is what the upstream received.
type seen struct {
	mu     sync.Mutex
	header http.Header
	body   string
}

// e2e starts an upstream, the processor with h, and the dataplane with
// the agent built by the ext_proc factory from the YAML configuration.
func e2e(t *testing.T, h handler, data map[string]string) (proxyURL string, up *seen, p *processor, stop func()) {
	u, s, pr, st, _ := e2eLogs(t, h, data)
	return u, s, pr, st
}

// e2eLogs is e2e, also returning the proxy's log.
func e2eLogs(t *testing.T, h handler, data map[string]string) (proxyURL string, up *seen, p *processor, stop func(), logs *testutil.LogBuffer) {
	t.Helper()
	up = &seen{}
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		up.mu.Lock()
		up.header, up.body = r.Header.Clone(), string(b)
		up.mu.Unlock()
		w.Header().Set("Server", "app")
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "hello from app")
	}))
	t.Cleanup(us.Close)
	p, addr, stop := startProcessor(t, h, nil)
	vals := map[string]string{"Upstream": strings.TrimPrefix(us.URL, "http://"), "Proc": addr}
	for k, v := range data {
		vals[k] = v
	}
	var b strings.Builder
	if err := template.Must(template.New("c").Parse(e2eConfig)).Execute(&b, vals); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("%v\n%s", err, b.String())
	}
	if err := transports.Check(cfg); err != nil {
		t.Fatal(err)
	}
	a, err := transports.Dialing()[config.TransportExtProc](cfg.Agent("proc"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := a.(interface{ WaitReady(context.Context) error }).WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	var url string
	url, logs = dptest.Serve(t, cfg, map[string]agentmux.Agent{"proc": a})
	return url, up, p, stop, logs
}

func get(t *testing.T, method, url, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	cl := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := cl.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestDataplaneMutations drives the proxy: request and response header
// mutations, a buffered request body replaced and a streamed response
// body rewritten reach the upstream and the client.
func TestDataplaneMutations(t *testing.T) {
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		var cr *extprocsvc.CommonResponse
		switch {
		case req.GetRequestHeaders() != nil:
			cr = &extprocsvc.CommonResponse{HeaderMutation: &extprocsvc.HeaderMutation{
				SetHeaders:    []*corev3.HeaderValueOption{hdr("x-user", "42", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD)},
				RemoveHeaders: []string{"x-secret"},
			}}
		case req.GetRequestBody() != nil:
			cr = &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_Body{
				Body: []byte(strings.ToUpper(string(req.GetRequestBody().GetBody()))),
			}}}
		case req.GetResponseHeaders() != nil:
			cr = &extprocsvc.CommonResponse{HeaderMutation: &extprocsvc.HeaderMutation{
				SetHeaders:    []*corev3.HeaderValueOption{hdr("x-processed", "yes", corev3.HeaderValueOption_APPEND_IF_EXISTS_OR_ADD)},
				RemoveHeaders: []string{"server"},
			}}
		case req.GetResponseBody() != nil:
			cr = &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{Mutation: &extprocsvc.BodyMutation_Body{
				Body: []byte(strings.ReplaceAll(string(req.GetResponseBody().GetBody()), "app", "proc")),
			}}}
		}
		return []*extprocsvc.ProcessingResponse{cont(req, cr)}, nil
	}
	url, up, p, _ := e2e(t, h, map[string]string{"Mode": "request_body_mode=BUFFERED,response_body_mode=STREAMED"})
	resp, body := get(t, "POST", url+"/upload", "hello body", "X-Secret", "s", "Content-Type", "text/plain")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.header.Get("X-User") != "42" || up.header.Get("X-Secret") != "" {
		t.Errorf("upstream headers %v", up.header)
	}
	if up.body != "HELLO BODY" {
		t.Errorf("upstream body %q", up.body)
	}
	if resp.Header.Get("X-Processed") != "yes" || resp.Header.Get("Server") != "" {
		t.Errorf("response headers %v", resp.Header)
	}
	if body != "hello from proc" {
		t.Errorf("response body %q", body)
	}
	testutil.WaitFor(t, "the stream to end", func() bool { return p.ended.Load() == 1 })
	if p.opened.Load() != 1 {
		t.Errorf("%d streams for one request", p.opened.Load())
	}
}

// TestDataplaneImmediateResponse: an immediate_response answers the
// client; the upstream never sees the request.
func TestDataplaneImmediateResponse(t *testing.T) {
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		return []*extprocsvc.ProcessingResponse{{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocsvc.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode_Forbidden},
			Headers: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{hdr("x-reason", "policy", 0)}},
			Body:    []byte("denied by processor"),
		}}}}, nil
	}
	url, up, _, _ := e2e(t, h, map[string]string{"Mode": ""})
	resp, body := get(t, "GET", url+"/x", "")
	if resp.StatusCode != 403 || body != "denied by processor" || resp.Header.Get("X-Reason") != "policy" {
		t.Errorf("status %d, body %q, headers %v", resp.StatusCode, body, resp.Header)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.header != nil {
		t.Error("the upstream got a blocked request")
	}
}

// TestDataplaneFailurePolicy: a hung processor times out (closed: 504;
// open: the request passes, marked) and a processor that is down fails
// per policy too (closed: failure_status, 500 by default as Envoy's
// status_on_error).
func TestDataplaneFailurePolicy(t *testing.T) {
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	hung := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		<-hang
		return nil, nil
	}
	t.Run("hung closed", func(t *testing.T) {
		url, _, _, _ := e2e(t, hung, map[string]string{"Mode": "", "Message": "100ms"})
		if resp, _ := get(t, "GET", url+"/x", ""); resp.StatusCode != 504 {
			t.Errorf("status %d, want 504", resp.StatusCode)
		}
	})
	t.Run("hung open", func(t *testing.T) {
		url, up, _, _ := e2e(t, hung, map[string]string{"Mode": "", "Message": "100ms", "Failure": "open"})
		resp, _ := get(t, "GET", url+"/x", "")
		if resp.StatusCode != 200 || resp.Header.Get("X-Sidecar-Fail-Open") != "proc" {
			t.Errorf("status %d, fail-open %q", resp.StatusCode, resp.Header.Get("X-Sidecar-Fail-Open"))
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		if up.header.Get("X-Sidecar-Fail-Open") != "proc" {
			t.Errorf("upstream not told: %v", up.header)
		}
	})
	t.Run("down closed", func(t *testing.T) {
		url, _, _, stop := e2e(t, continueAll, map[string]string{"Mode": ""})
		stop()
		testutil.WaitFor(t, "the proxy to fail closed", func() bool {
			resp, _ := get(t, "GET", url+"/x", "")
			return resp.StatusCode == 500
		})
	})
	t.Run("down closed, failure_status", func(t *testing.T) {
		url, _, _, stop := e2e(t, continueAll, map[string]string{"Mode": "", "Status": "503"})
		stop()
		testutil.WaitFor(t, "the proxy to fail closed", func() bool {
			resp, _ := get(t, "GET", url+"/x", "")
			return resp.StatusCode == 503
		})
	})
	t.Run("wrong phase closed", func(t *testing.T) {
		wrong := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
			return []*extprocsvc.ProcessingResponse{{Response: &extprocsvc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocsvc.HeadersResponse{}}}}, nil
		}
		url, _, _, _ := e2e(t, wrong, map[string]string{"Mode": ""})
		if resp, body := get(t, "GET", url+"/x", ""); resp.StatusCode != 500 || body != "internal server error" {
			t.Errorf("status %d %q, want 500", resp.StatusCode, body)
		}
	})
}

// TestDataplaneRefusals: a processor's mutation goes through the same
// rules as any agent's: a hop-by-hop header or an invalid name is refused.
func TestDataplaneRefusals(t *testing.T) {
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		var cr *extprocsvc.CommonResponse
		if req.GetRequestHeaders() != nil {
			cr = &extprocsvc.CommonResponse{HeaderMutation: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				hdr("connection", "close", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
				hdr(":path", "/admin", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
				hdr("x-ok", "1", corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD),
			}}}
		}
		return []*extprocsvc.ProcessingResponse{cont(req, cr)}, nil
	}
	url, up, _, _, logs := e2eLogs(t, h, map[string]string{"Mode": ""})
	resp, _ := get(t, "GET", url+"/x", "")
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if !strings.Contains(logs.String(), `"refused":2`) {
		t.Errorf("refusals not reported:\n%s", logs.String())
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	if up.header.Get("X-Ok") != "1" {
		t.Errorf("allowed mutation not applied: %v", up.header)
	}
	if _, ok := up.header[":path"]; ok {
		t.Error("pseudo-header reached the upstream")
	}
}

// TestDataplaneBufferedChunks: a BUFFERED body the proxy reads in several
// chunks reaches the processor whole, once, and its replacement reaches
// the upstream (request) and the client (response) whole.
func TestDataplaneBufferedChunks(t *testing.T) {
	var mu sync.Mutex
	var sizes []int
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		var body []byte
		switch {
		case req.GetRequestBody() != nil:
			body = req.GetRequestBody().GetBody()
		case req.GetResponseBody() != nil:
			body = req.GetResponseBody().GetBody()
		default:
			return continueAll(req)
		}
		mu.Lock()
		sizes = append(sizes, len(body))
		mu.Unlock()
		return []*extprocsvc.ProcessingResponse{cont(req, &extprocsvc.CommonResponse{BodyMutation: &extprocsvc.BodyMutation{
			Mutation: &extprocsvc.BodyMutation_Body{Body: []byte(strings.ToUpper(string(body)))},
		}})}, nil
	}
	url, up, _, _ := e2e(t, h, map[string]string{"Mode": "request_body_mode=BUFFERED,response_body_mode=BUFFERED", "Chunk": "1KiB"})
	in := strings.Repeat("abcdefghij", 500) // 5000 bytes: 5 chunks
	resp, body := get(t, "POST", url+"/upload", in, "Content-Type", "text/plain")
	if resp.StatusCode != 200 || body != "HELLO FROM APP" {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	up.mu.Lock()
	got := up.body
	up.mu.Unlock()
	if got != strings.ToUpper(in) {
		t.Errorf("upstream got %d bytes, want the whole body upper-cased", len(got))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 2 || sizes[0] != 5000 || sizes[1] != len("hello from app") {
		t.Errorf("processor saw bodies of %v bytes", sizes)
	}
}
