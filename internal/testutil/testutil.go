// Package testutil holds the helpers the tests of several packages share:
// short socket directories, polling waits and a throwaway PKI (agents on
// real Unix sockets are in testagent). It is imported by _test files only.
package testutil

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// LongWait bounds every wait on something that should happen: generous,
// because it only decides how long a broken build takes to fail, never
// whether a working one passes.
const LongWait = 30 * time.Second

// SocketDir is a fresh directory with a short path, removed when the test
// ends: a Unix socket path must stay under 108 bytes, which t.TempDir()
// can exceed.
func SocketDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// SocketPath is a socket path in a fresh SocketDir.
func SocketPath(t testing.TB) string {
	t.Helper()
	return filepath.Join(SocketDir(t), "a.sock")
}

// ConnPair returns both ends of a real connection, closed when the test
// ends: network "tcp" on loopback, or "unix" at a SocketPath. dialed is
// the end net.Dial returned, accepted the listener's.
func ConnPair(t testing.TB, network string) (dialed, accepted net.Conn) {
	t.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = SocketPath(t)
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	dialed, err = net.Dial(network, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	if accepted = <-acc; accepted == nil {
		dialed.Close()
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { dialed.Close(); accepted.Close() })
	return dialed, accepted
}

// WaitFor polls cond until it holds, failing the test after LongWait.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(LongWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// ThreadPolicies reads the scheduling policy (field 41 of
// /proc/<pid>/task/<tid>/stat) of every thread of pid
// (0 SCHED_OTHER, 3 SCHED_BATCH); it skips the test where there is no
// /proc.
func ThreadPolicies(t testing.TB, pid int) []int {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Skip("no /proc:", err)
	}
	var out []int
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "stat"))
		if err != nil {
			continue // the thread ended
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		// Fields after the command name start at field 3 (state).
		var pol int
		if _, err := fmt.Sscan(f[41-3], &pol); err != nil {
			t.Fatal(err)
		}
		out = append(out, pol)
	}
	return out
}

// HasBytes reports whether bytes are waiting in c's receive queue, without
// taking them (a non-blocking MSG_PEEK on c's socket).
func HasBytes(t testing.TB, c net.Conn) bool {
	t.Helper()
	n, err := peek(t, c)
	return err == nil && n > 0
}

// PeerClosed reports whether c's peer has closed and nothing is left to
// read before the end of the stream (the same peek finds it).
func PeerClosed(t testing.TB, c net.Conn) bool {
	t.Helper()
	n, err := peek(t, c)
	return err == nil && n == 0
}

// peek looks at c's receive queue without taking from it or waiting.
func peek(t testing.TB, c net.Conn) (n int, err error) {
	t.Helper()
	sc, ok := c.(syscall.Conn)
	if !ok {
		t.Fatalf("%T has no socket to peek", c)
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if cerr := raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	}); cerr != nil {
		return 0, cerr // the socket is gone
	}
	return n, err
}
