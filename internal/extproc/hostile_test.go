package extproc_test

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// An ImmediateResponse the proxy cannot send as it is — a 1xx or
// out-of-range status, framing, hop-by-hop or pseudo headers — never
// reaches the client as such: a bad status fails the agent (closed: the
// failure status, 500 for ext_proc as Envoy's status_on_error),
// bad headers are dropped. Every request's stream ends.
func TestDataplaneHostileImmediateResponse(t *testing.T) {
	codes := map[string]typev3.StatusCode{"/s101": 101, "/s100": 100, "/s999": 999, "/s0": 0, "/s-5": -5, "/hdrs": 403}
	h := func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
		path, _ := headerOf(req.GetRequestHeaders().GetHeaders(), ":path")
		return []*extprocsvc.ProcessingResponse{{Response: &extprocsvc.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocsvc.ImmediateResponse{
			Status: &typev3.HttpStatus{Code: codes[path]},
			Headers: &extprocsvc.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
				hdr("content-length", "1", 0), hdr("transfer-encoding", "chunked", 0), hdr("connection", "upgrade", 0),
				hdr("upgrade", "websocket", 0), hdr(":status", "200", 0), hdr("x-sidecar-fail-open", "x", 0),
				hdr("x-ok", "yes", 0), hdr("x-bad", "a\r\nset-cookie: evil=1", 0),
			}},
			Body: []byte("nope"),
		}}}}, nil
	}
	url, up, p, _ := e2e(t, h, map[string]string{"Mode": ""})
	want := map[string]int{"/s101": 500, "/s100": 500, "/s999": 500, "/s0": 200, "/s-5": 500, "/hdrs": 403}
	n := int64(0)
	for path, status := range want {
		resp, body := get(t, "GET", url+path, "")
		n++
		if resp.StatusCode != status {
			t.Errorf("%s: status %d, want %d", path, resp.StatusCode, status)
		}
		if resp.StatusCode == 500 {
			continue
		}
		if body != "nope" || resp.Header.Get("X-Ok") != "yes" || resp.Header.Get("Upgrade") != "" || resp.Header.Get("Set-Cookie") != "" ||
			resp.Header.Get("X-Bad") != "" || resp.Header.Get("X-Sidecar-Fail-Open") != "" || len(resp.TransferEncoding) != 0 {
			t.Errorf("%s: body %q, headers %v", path, body, resp.Header)
		}
	}
	up.mu.Lock()
	got := up.header
	up.mu.Unlock()
	if got != nil {
		t.Error("the upstream got a request")
	}
	testutil.WaitFor(t, "every stream to end", func() bool { return p.ended.Load() == n && p.opened.Load() == n })
}
