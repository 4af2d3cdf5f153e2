package systemd

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// TestListenersForAnotherProcess: variables whose LISTEN_PID is not this
// process's are another process's: no socket is taken, and the
// variables are unset either way.
func TestListenersForAnotherProcess(t *testing.T) {
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()+1))
	t.Setenv("LISTEN_FDS", "1")
	t.Setenv("LISTEN_FDNAMES", "web")
	got, err := Listeners()
	if err != nil || len(got) != 0 {
		t.Fatalf("Listeners: %v, %v; want none", got, err)
	}
	for _, k := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		if _, set := os.LookupEnv(k); set {
			t.Errorf("%s still set", k)
		}
	}
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("LISTEN_FDS", "x")
	if _, err := Listeners(); err == nil {
		t.Error("LISTEN_FDS=x accepted")
	}
}

func TestMatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	for addr, want := range map[string]bool{
		"127.0.0.1:" + port: true, "localhost:" + port: true, "127.0.0.2:" + port: false,
		"0.0.0.0:" + port: false, ":" + port: false, "127.0.0.1:0": false, "unix:/x": false,
	} {
		if got := Match(ln, addr); got != want {
			t.Errorf("Match(%s): %v, want %v", addr, got, want)
		}
	}
	path := filepath.Join(t.TempDir(), "s")
	ul, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ul.Close()
	if !Match(ul, "unix:"+path) || Match(ul, "unix:"+path+"x") || Match(ul, "127.0.0.1:1") {
		t.Error("unix socket matched wrongly")
	}
}

func TestNotify(t *testing.T) {
	if ok, err := Notify("READY=1"); ok || err != nil {
		t.Fatalf("without NOTIFY_SOCKET: %v %v", ok, err)
	}
	path := filepath.Join(t.TempDir(), "n")
	c, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Setenv("NOTIFY_SOCKET", path)
	if ok, err := Notify("READY=1"); !ok || err != nil {
		t.Fatalf("Notify: %v %v", ok, err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "READY=1" {
		t.Fatalf("read %q %v", buf[:n], err)
	}
	t.Setenv("NOTIFY_SOCKET", "relative")
	if _, err := Notify("READY=1"); err == nil {
		t.Error("a relative NOTIFY_SOCKET accepted")
	}
}
