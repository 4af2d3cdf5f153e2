package reverse

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestMain doubles as a stand-alone agent process when the environment
// asks for one, so that tests can kill a real agent process.
func TestMain(m *testing.M) {
	if addr := os.Getenv("REVERSE_TEST_AGENT_ADDR"); addr != "" {
		os.Exit(helperAgent(addr, os.Getenv("REVERSE_TEST_AGENT_ID")))
	}
	os.Exit(m.Run())
}

// helperAgent serves a handler that holds every request and reports each
// on stdout, until SIGTERM.
func helperAgent(addr, id string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	h := newHandler(id)
	h.gate = make(chan struct{})
	h.entered = make(chan string, 1024)
	go func() {
		for range h.entered {
			fmt.Println("entered")
		}
	}()
	err := sdk.DialAndServe(ctx, sdk.ReverseConfig{
		Address: addr, AgentID: id, Token: testToken,
		OnRegistered: func(string) { fmt.Println("registered") },
	}, h)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// TestAgentProcessKilled: SIGKILL an agent process holding requests; they
// fail with ErrAgentConnLost, the other agent carries on.
func TestAgentProcessKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process")
	}
	cfg := testConfig(t)
	l := startListener(t, cfg)
	a := l.Agent("waf")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "REVERSE_TEST_AGENT_ADDR="+cfg.UnixPath, "REVERSE_TEST_AGENT_ID=waf-proc")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		select {
		case got, ok := <-lines:
			if !ok || got != want {
				t.Fatalf("agent process said %q (open %v), want %q", got, ok, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("agent process did not say %q", want)
		}
	}
	expect("registered")
	testutil.WaitFor(t, "process agent in pool", func() bool { return a.Snapshot().Connections == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // hang guard only
	defer cancel()
	const n = 4
	results := make(chan error, n)
	for i := 0; i < n; i++ {
		ex, err := a.Begin(agentmux.WaitFor(ctx))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			defer ex.Finish()
			m := protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
			_, err := ex.RequestHeaders(agentmux.WaitFor(ctx), &m)
			results <- err
		}()
	}
	for i := 0; i < n; i++ {
		expect("entered")
	}
	// A second, in-process agent joins; then the process dies hard.
	runAgent(t, cfg.UnixPath, "waf-2", testToken, newHandler("waf-2"), nil)
	testutil.WaitFor(t, "second agent", func() bool { return a.Snapshot().Connections == 2 })
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		if err := <-results; !errors.Is(err, agentmux.ErrAgentConnLost) {
			t.Fatalf("request on the killed process: %v, want ErrAgentConnLost", err)
		}
	}
	testutil.WaitFor(t, "dead process leaves the pool", func() bool { return a.Snapshot().Connections == 1 })
	for i := 0; i < 4; i++ {
		if got, err := call(ctx, a); err != nil || got != "waf-2" {
			t.Fatalf("after the kill: %q, %v", got, err)
		}
	}
}
