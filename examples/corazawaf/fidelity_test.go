package corazawaf_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/sdk"
)

// rawStatus sends raw request bytes to the stack and returns the status
// of the response.
func rawStatus(t *testing.T, st *stack, raw string) int {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(st.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(testutil.LongWait))
	if _, err := c.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("reading the response: %v", err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// crsFramingCases are requests CRS at paranoia 1 lets through when it
// sees the client's framing (Coraza's own net/http middleware in front of
// a backend answers 200 to each), and blocks when the framing is hidden:
// 920180 ("POST without Content-Length or Transfer-Encoding") adds to
// 920350 (a numeric Host) past the inbound threshold.
var crsFramingCases = []struct{ name, raw string }{
	{"content-length 0 with an IP host", "POST /api/items HTTP/1.1\r\nHost: 10.0.0.7\r\nUser-Agent: crs-test\r\nAccept: */*\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"},
	{"chunked JSON with an IP host", "POST /api/items HTTP/1.1\r\nHost: 10.0.0.7\r\nUser-Agent: crs-test\r\nAccept: */*\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
		"d\r\n{\"name\":\"pen\"\r\n1\r\n}\r\n0\r\n\r\n"},
}

// TestCRSSeesClientFraming: with the client's view of the request
// (client_request, which the SDK declares by default), a bodiless POST
// with Content-Length: 0 and a chunked JSON POST pass CRS at paranoia 1,
// as they pass Coraza deployed directly; with the forwarded view they
// were blocked.
func TestCRSSeesClientFraming(t *testing.T) {
	for _, view := range []struct {
		name string
		opts *sdk.Options
		want int
	}{
		{"client view", &sdk.Options{Name: "corazawaf"}, http.StatusOK},
		{"forwarded view", &sdk.Options{Name: "corazawaf", NoClientRequest: true}, http.StatusForbidden},
	} {
		t.Run(view.name, func(t *testing.T) {
			st := startStackWith(t, corazawaf.DefaultConfig(), view.opts)
			for _, tc := range crsFramingCases {
				if got := rawStatus(t, st, tc.raw); got != view.want {
					t.Errorf("%s: status %d, want %d", tc.name, got, view.want)
				}
			}
		})
	}
}

// TestCRSSeesAbsoluteTarget: the request line the rules check is the one
// the client sent ("GET http://shop.example/products?id=7 HTTP/1.1"), not
// the origin-form target the upstream gets: a rule on REQUEST_LINE finds
// the absolute form, and a benign absolute-form request passes CRS.
func TestCRSSeesAbsoluteTarget(t *testing.T) {
	cfg := corazawaf.DefaultConfig()
	cfg.ExtraDirectives = `SecRule REQUEST_LINE "@beginsWith GET http://shop.example/marked" "id:10001,phase:1,deny,status:403,log,msg:'absolute-form seen'"`
	st := startStack(t, cfg)
	base := "GET http://shop.example%s HTTP/1.1\r\nHost: shop.example\r\nUser-Agent: crs-test\r\nAccept: */*\r\nConnection: close\r\n\r\n"
	if got := rawStatus(t, st, fmt.Sprintf(base, "/products?id=7")); got != http.StatusOK {
		t.Errorf("a benign absolute-form request: status %d, want 200", got)
	}
	if got := rawStatus(t, st, fmt.Sprintf(base, "/marked")); got != http.StatusForbidden {
		t.Errorf("REQUEST_LINE did not carry the absolute form: status %d, want 403", got)
	}
}
