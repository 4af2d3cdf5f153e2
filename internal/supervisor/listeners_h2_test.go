package supervisor

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/net/http2"

	st "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestReloadListenerGainsH2C: a reload that adds h2c to a listener's
// protocols gives the listener that replaces it its HTTP/2 server, and a
// listener a reload adds serves h2c too: a client with prior knowledge
// is answered on both.
func TestReloadListenerGainsH2C(t *testing.T) {
	dir := testutil.SocketDir(t)
	up := st.StartUpstream(t, "app")
	addrs := make([]string, 2)
	for i := range addrs {
		probe, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs[i] = probe.Addr().String()
		probe.Close() // the sidecar binds it next
	}
	conf := func(ls string) string {
		return fmt.Sprintf("listeners:\n%s\nupstreams: [{name: app, address: %q}]\nroutes: [{name: main, upstream: app}]\nadmin: {enabled: false}\n", ls, up.Addr)
	}
	path := filepath.Join(dir, "sidecar.yaml")
	st.WriteConfig(t, path, conf(fmt.Sprintf("  - {name: web, address: %q}", addrs[0])))
	s := startInProcess(t, path)

	st.WriteConfig(t, path, conf(fmt.Sprintf("  - {name: web, address: %q, protocols: [http1, h2c]}\n  - {name: more, address: %q, protocols: [h2c]}", addrs[0], addrs[1])))
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	h2c := &http.Client{Timeout: 10 * time.Second, Transport: &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}}
	for _, addr := range addrs {
		resp, err := h2c.Get("http://" + addr + "/")
		if err != nil {
			t.Fatalf("h2c to %s after the reload: %v", addr, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != 200 || string(body) != "app\n" {
			t.Fatalf("h2c to %s: %s %d %q", addr, resp.Proto, resp.StatusCode, body)
		}
	}
}
