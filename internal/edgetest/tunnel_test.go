package edgetest

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
)

// TestTunnelsWithinDescriptorBudget: an upgraded connection leaves the
// HTTP server, so it is not one of max_connections, yet it holds a
// descriptor. Under ulimit -n 256 the listener's budget (96 client
// connections) is shared: 48 tunnels, not the default 1024, and the next
// upgrade is refused with 503 while ordinary requests are still served.
func TestTunnelsWithinDescriptorBudget(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to set the descriptor limit")
	}
	dir := testutil.SocketDir(t)
	up := startUpstream(t)
	testagent.Serve(t, filepath.Join(dir, "policy.sock"), newPolicyAgent())
	sc := startSidecar(t, dir, edgeConfig(dir, up.addr, ""), "ulimit -n 256; exec")
	testutil.WaitFor(t, "agent connected", func() bool {
		resp, err := http.Get("http://" + sc.admin + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	upgrade := func(id string) int {
		t.Helper()
		c, err := net.Dial("tcp", sc.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		_ = c.SetDeadline(time.Now().Add(longWait))
		if _, err := io.WriteString(c, get("/upgrade", "public.example", id, "Connection: Upgrade", "Upgrade: websocket")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "GET"})
		if err != nil {
			t.Fatalf("upgrade %s: %v", id, err)
		}
		return resp.StatusCode
	}
	for i := 0; i < 48; i++ {
		if st := upgrade(fmt.Sprintf("tun-%d", i)); st != http.StatusSwitchingProtocols {
			t.Fatalf("tunnel %d: status %d, want 101", i, st)
		}
	}
	if st := upgrade("tun-over"); st != http.StatusServiceUnavailable {
		t.Fatalf("tunnel 49 under ulimit -n 256: status %d, want 503", st)
	}
	resp, err := http.Get("http://" + sc.addr + "/plain")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("ordinary request: status %d", resp.StatusCode)
	}
	if !sc.alive() {
		t.Fatal("sidecar exited")
	}
}
