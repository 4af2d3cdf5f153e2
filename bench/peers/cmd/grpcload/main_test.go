package main

import (
	"context"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/echo"
)

// echoServer serves the Echo services (cmd/grpcupstream's) on a loopback
// port and counts the calls.
func echoServer(t *testing.T) (addr string, calls *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	calls = new(atomic.Int64)
	s := grpc.NewServer()
	echo.Register(s, func(context.Context, *wrapperspb.BytesValue, bool) { calls.Add(1) })
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return ln.Addr().String(), calls
}

// TestLoadReport: a short load against a real grpc-go server reports, in
// the lines the harness reads (parseWrk), as many calls as reached it.
func TestLoadReport(t *testing.T) {
	addr, calls := echoServer(t)
	var out, errOut strings.Builder
	if code := run([]string{"-c", "2", "-m", "2", "-d", "300ms", addr}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	m := regexp.MustCompile(`(?m)^\s+(\d+) requests in (\d+\.\d\d)s, `).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no \"requests in\" line:\n%s", out.String())
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	if n == 0 || n != calls.Load() {
		t.Errorf("reported %d calls, the server saw %d", n, calls.Load())
	}
	for _, p := range []string{"50%", "99%"} {
		if !regexp.MustCompile(`(?m)^\s+` + p + ` \d+\.\d\dus$`).MatchString(out.String()) {
			t.Errorf("no %s line:\n%s", p, out.String())
		}
	}
	if strings.Contains(out.String(), "Non-2xx") {
		t.Errorf("failures reported:\n%s", out.String())
	}
}

// TestCheck: -check passes against a server that answers; -check -deny
// fails against one that lets /admin/Echo through (no proxy denies it).
func TestCheck(t *testing.T) {
	addr, calls := echoServer(t)
	var out, errOut strings.Builder
	if code := run([]string{"-check", addr}, &out, &errOut); code != 0 || calls.Load() != 1 {
		t.Errorf("-check: exit %d (%s), %d calls", code, errOut.String(), calls.Load())
	}
	errOut.Reset()
	if code := run([]string{"-check", "-deny", addr}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "want it denied") {
		t.Errorf("-check -deny without a proxy: exit %d (%s), want 1", code, errOut.String())
	}
}
