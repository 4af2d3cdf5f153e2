package sdk_test

import (
	"bytes"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// readmeSocket is the socket path the README's agent listens on; the test
// points it at a temporary directory.
const readmeSocket = "/run/sidecar/agent.sock"

// readmeAgent extracts the Go program between the readme-agent markers
// of README.md.
func readmeAgent(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	_, rest, ok := strings.Cut(s, "<!-- readme-agent:begin -->")
	if !ok {
		t.Fatal("README.md: no <!-- readme-agent:begin --> marker")
	}
	body, _, ok := strings.Cut(rest, "<!-- readme-agent:end -->")
	if !ok {
		t.Fatal("README.md: no <!-- readme-agent:end --> marker")
	}
	body = strings.TrimSpace(body)
	body, ok = strings.CutPrefix(body, "```go\n")
	if !ok {
		t.Fatal("README.md: the agent is not a ```go block")
	}
	body, ok = strings.CutSuffix(body, "```")
	if !ok {
		t.Fatal("README.md: the agent's block does not end with ```")
	}
	if !strings.Contains(body, `"`+readmeSocket+`"`) {
		t.Fatalf("README.md: the agent no longer listens on %s; update the test", readmeSocket)
	}
	return body
}

// buildReadmeAgent builds the README's agent, listening on sock, in a
// module of its own that replaces the SDK's module by this checkout.
func buildReadmeAgent(t *testing.T, sock string) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a program")
	}
	src := strings.Replace(readmeAgent(t), `"`+readmeSocket+`"`, `"`+sock+`"`, 1)
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	gomod := "module readmeagent\n\ngo 1.26.0\n\nrequire github.com/zentinelproxy/sidecar v0.0.0\n\nreplace github.com/zentinelproxy/sidecar => " + root + "\n"
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"go.mod": []byte(gomod), "go.sum": sum, "main.go": []byte(src)} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "agent")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-mod=mod", "-o", bin, ".")
	cmd.Dir = dir
	// The module's requirements are the checkout's: resolved from the
	// module cache, never fetched.
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the README's agent: %v\n%s\n%s", err, out, src)
	}
	return bin
}

// TestReadmeAgent: the README's agent, built as written, fails loudly
// when its socket's directory is missing (it used to exit 0 without a
// word), serves when it exists, and on SIGTERM stops cleanly and removes
// its socket.
func TestReadmeAgent(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	sock := filepath.Join(dir, "agent.sock")
	bin := buildReadmeAgent(t, sock)

	// The directory is missing: a non-zero exit and an error naming it.
	var stderr bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Stderr = &stderr
	err := runBounded(t, cmd)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("missing socket directory: exit %v, want a failure; stderr %q", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), dir) || !strings.Contains(stderr.String(), sdk.ErrSDKSocketDir.Error()) {
		t.Fatalf("missing socket directory: stderr %q does not name %s", stderr.String(), dir)
	}

	// The directory exists: it serves.
	if err := os.Mkdir(dir, 0o750); err != nil {
		t.Fatal(err)
	}
	stderr.Reset()
	cmd = exec.Command(bin)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	c := dialWhenUp(t, sock, exited)
	readmeBlocks(t, c)
	_ = c.Close()

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("after SIGTERM: %v (want a clean exit); stderr %q", err, stderr.String())
		}
	case <-time.After(serveHangGuardExt):
		t.Fatal("the agent did not stop on SIGTERM")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind after SIGTERM: %v", err)
	}
}

const serveHangGuardExt = 20 * time.Second

func runBounded(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(serveHangGuardExt):
		_ = cmd.Process.Kill()
		<-done
		t.Fatal("the agent neither served nor exited")
		return nil
	}
}

func dialWhenUp(t *testing.T, sock string, exited <-chan error) net.Conn {
	t.Helper()
	deadline := time.Now().Add(serveHangGuardExt)
	for {
		c, err := net.Dial("unix", sock)
		if err == nil {
			return c
		}
		select {
		case err := <-exited:
			t.Fatalf("the agent exited: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent's socket never accepted: %v", err)
		}
	}
}

// readmeBlocks handshakes as the proxy and checks that /private is
// blocked with 403.
func readmeBlocks(t *testing.T, c net.Conn) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(serveHangGuardExt))
	if err := uds.WriteFrame(c, &protocol.HandshakeRequest{ProtocolVersion: 2, ClientName: "test"}); err != nil {
		t.Fatal(err)
	}
	fr := uds.NewFrameReader(c)
	if typ, _, err := fr.Next(); err != nil || typ != protocol.TypeHandshakeResponse {
		t.Fatalf("handshake answer: type %s, %v", typ, err)
	}
	// The path as the sidecar routed it: the agent decides on it, not on
	// the target as forwarded.
	ev := &protocol.RequestHeaders{RequestID: 7, Method: []byte("GET"), URI: []byte("/a/../private/x"),
		Metadata: protocol.Metadata{Path: []byte("/private/x")}}
	if err := uds.WriteFrame(c, ev); err != nil {
		t.Fatal(err)
	}
	typ, p, err := fr.Next()
	if err != nil || typ != protocol.TypeDecision {
		t.Fatalf("answer: type %s, %v", typ, err)
	}
	var d protocol.Decision
	if err := d.Decode(p); err != nil {
		t.Fatal(err)
	}
	if d.RequestID != 7 || d.Kind != protocol.DecisionBlock || d.Status != 403 {
		t.Fatalf("decision %+v, want a 403 block of request 7", d)
	}
}
