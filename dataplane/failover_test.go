package dataplane_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/transports"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestMain doubles as a stand-alone agent process when the environment
// asks for one, so that failover tests can kill a real agent process.
func TestMain(m *testing.M) {
	if sock := os.Getenv("DATAPLANE_TEST_AGENT_SOCK"); sock != "" {
		os.Exit(memberAgent(sock, os.Getenv("DATAPLANE_TEST_AGENT_ID"), os.Getenv("DATAPLANE_TEST_AGENT_HOLD") != ""))
	}
	os.Exit(m.Run())
}

// memberAgent serves an SDK agent that tags each request with its id
// (x-member) and, with hold, holds requests for /hold (printing
// "entered") until the process is killed. It prints "ready" once it
// listens.
func memberAgent(sock, id string, hold bool) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	ln, err := sdk.ListenUDS(sock, nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	h := &agentFuncs{
		Base: sdk.Base{Caps: headersOnly()},
		reqHeaders: func(ctx context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
			if hold && string(m.URI) == "/hold" {
				fmt.Println("entered")
				<-ctx.Done()
			}
			d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-member"), Value: []byte(id)})
			return nil
		},
	}
	fmt.Println("ready")
	if err := sdk.Serve(ctx, ln, h, nil); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// memberProc is a running member agent process and its stdout lines.
type memberProc struct {
	cmd   *exec.Cmd
	lines chan string
}

func startMember(t *testing.T, sock, id string, hold bool) *memberProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "DATAPLANE_TEST_AGENT_SOCK="+sock, "DATAPLANE_TEST_AGENT_ID="+id)
	if hold {
		cmd.Env = append(cmd.Env, "DATAPLANE_TEST_AGENT_HOLD=1")
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	p := &memberProc{cmd: cmd, lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
	p.expect(t, "ready")
	return p
}

func (p *memberProc) expect(t *testing.T, want string) {
	t.Helper()
	select {
	case l, ok := <-p.lines:
		if !ok || l != want {
			t.Fatalf("member said %q (open %v), want %q", l, ok, want)
		}
	case <-time.After(hangGuard):
		t.Fatalf("member never said %q", want)
	}
}

const failoverConfig = `
listeners:
  - name: test
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: {{.Upstream}}
agents:
  - name: pair
    transport: uds
    address: {{.A}}
    addresses: [{{.B}}]
    failover: {{.Failover}}
    timeouts:
      connect: 200ms
      message: 5s
routes:
  - name: main
    upstream: app
    agents: [pair]
`

func failoverSetup(t *testing.T, failover bool) (*proxy, *upstream, *memberProc, *memberProc) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts agent processes")
	}
	u := newUpstream(t, nil)
	sockA, sockB := testutil.SocketPath(t), testutil.SocketPath(t)
	a := startMember(t, sockA, "A", true)
	b := startMember(t, sockB, "B", false)
	cfg := configText(t, failoverConfig, map[string]any{"Upstream": u.addr(), "A": sockA, "B": sockB, "Failover": failover})
	// The agent instance as the sidecar builds it: one client per member.
	inst, err := transports.NewUDS(cfg.Agent("pair"), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	m, ok := inst.(*agentmux.Multi)
	if !ok {
		t.Fatalf("instance %T, want *agentmux.Multi", inst)
	}
	ctx, cancel := context.WithTimeout(context.Background(), hangGuard)
	defer cancel()
	for _, mem := range m.Members() {
		if err := mem.(interface{ WaitReady(context.Context) error }).WaitReady(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return startProxy(t, cfg, map[string]agentmux.Agent{"pair": inst}, nil), u, a, b
}

func failoverStatus(t *testing.T, p *proxy) dataplane.FailoverStatus {
	t.Helper()
	return onlyAgent(t, p.srv.PolicyStatus().Failovers, func(s dataplane.FailoverStatus) string { return s.Agent }, "pair")
}

// Two member processes; the one holding a request is killed: the request
// is sent again to the other member and succeeds, and so does every
// request after it.
func TestFailoverMemberKilled(t *testing.T) {
	p, up, a, _ := failoverSetup(t, true)
	seen := map[string]int{}
	for i := 0; i < 6; i++ {
		resp, _ := p.do(t, "GET", "/", nil)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		seen[up.last(t).Header.Get("X-Member")]++
	}
	if seen["A"] == 0 || seen["B"] == 0 {
		t.Fatalf("members used %v, want both", seen)
	}
	// /hold goes to the members in turn; B answers it at once, A holds it.
	type result struct {
		status int
		member string
	}
	done := make(chan result, 1)
	for {
		go func() {
			resp, _ := p.do(t, "GET", "/hold", nil)
			done <- result{resp.StatusCode, up.last(t).Header.Get("X-Member")}
		}()
		select {
		case r := <-done:
			if r.status != 200 || r.member != "B" {
				t.Fatalf("/hold answered %d by %q before A held one", r.status, r.member)
			}
			continue
		case l := <-a.lines:
			if l != "entered" {
				t.Fatalf("member A said %q", l)
			}
		case <-time.After(hangGuard):
			t.Fatal("no /hold request reached a member")
		}
		break
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.status != 200 || r.member != "B" {
		t.Fatalf("held request after the kill: %d by %q, want 200 by B", r.status, r.member)
	}
	st := failoverStatus(t, p)
	if st.Retried != 1 || st.Recovered != 1 {
		t.Fatalf("failover counters %+v, want one retry, recovered", st)
	}
	for i := 0; i < 6; i++ {
		resp, _ := p.do(t, "GET", "/", nil)
		if resp.StatusCode != 200 || up.last(t).Header.Get("X-Member") != "B" {
			t.Fatalf("after the kill: %d by %q", resp.StatusCode, up.last(t).Header.Get("X-Member"))
		}
	}
	if st := failoverStatus(t, p); st.Retried != 1 {
		t.Fatalf("requests after the kill retried: %+v", st)
	}
}

// failover: false — the held request fails by the failure policy.
func TestFailoverOff(t *testing.T) {
	p, up, a, _ := failoverSetup(t, false)
	done := make(chan int, 1)
	for {
		go func() {
			resp, _ := p.do(t, "GET", "/hold", nil)
			done <- resp.StatusCode
		}()
		select {
		case st := <-done:
			if st != 200 || up.last(t).Header.Get("X-Member") != "B" {
				t.Fatalf("/hold answered %d before A held one", st)
			}
			continue
		case <-a.lines:
		case <-time.After(hangGuard):
			t.Fatal("no /hold request reached a member")
		}
		break
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	if st := <-done; st != 503 {
		t.Fatalf("held request with failover off: %d, want 503", st)
	}
	if st := failoverStatus(t, p); st.Retried != 0 {
		t.Fatalf("retried with failover off: %+v", st)
	}
	if !strings.Contains(p.logs.String(), "agent failed") {
		t.Fatalf("no failure logged:\n%s", p.logs.String())
	}
}
