package main

import (
	"context"
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/examples/allowagent"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/sdk"
)

func TestAgentCheckCommand(t *testing.T) {
	dir := testutil.SocketDir(t)
	sock := filepath.Join(dir, "a.sock")
	ln, err := sdk.ListenUDS(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = sdk.Serve(ctx, ln, allowagent.New(false), &sdk.Options{Name: "allow"}) }()
	t.Cleanup(func() { cancel(); <-done })

	var out, errw strings.Builder
	code := sidecarMain([]string{"agent-check", "-address", sock, "-only", "handshake,ping,phases", "-json"}, &out, &errw)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, out.String(), errw.String())
	}
	var rep struct {
		Agent   string `json:"agent"`
		Results []struct{ ID, Status string }
		Summary map[string]int `json:"summary"`
	}
	if err := json.Unmarshal([]byte(out.String()), &rep); err != nil {
		t.Fatalf("json: %v\n%s", err, out.String())
	}
	if rep.Agent != "allow" || len(rep.Results) != 3 || rep.Summary["PASS"] != 3 {
		t.Fatalf("report: %+v", rep)
	}

	// An agent that is not running is one line, and no check runs.
	out.Reset()
	errw.Reset()
	none := filepath.Join(dir, "none.sock")
	code = sidecarMain([]string{"agent-check", "-address", none, "-timeout", "200ms"}, &out, &errw)
	if want := "sidecar: cannot connect to " + none + ": no such file or directory\n"; code != 1 || out.String() != "" || errw.String() != want {
		t.Fatalf("exit %d, stdout %q, stderr %q; want stderr %q", code, out.String(), errw.String(), want)
	}

	// A FAIL is exit 1, with the table on stdout: an agent that accepts
	// and says nothing.
	silent := filepath.Join(dir, "silent.sock")
	sln, err := net.Listen("unix", silent)
	if err != nil {
		t.Fatal(err)
	}
	defer sln.Close()
	go func() {
		for {
			c, err := sln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	out.Reset()
	errw.Reset()
	code = sidecarMain([]string{"agent-check", "-address", silent, "-only", "handshake", "-timeout", "200ms"}, &out, &errw)
	if code != 1 || !strings.Contains(out.String(), "FAIL handshake") {
		t.Fatalf("exit %d:\n%s\n%s", code, out.String(), errw.String())
	}

	for _, c := range []struct {
		args []string
		code int
	}{
		{[]string{"agent-check"}, 2},
		{[]string{"agent-check", "-address", sock, "-only", "nosuch"}, 1},
		{[]string{"agent-check", "-address", sock, "-transport", "tcp"}, 1},
		{[]string{"agent-check", "-address", sock, "-expect", filepath.Join(dir, "none.yaml")}, 1},
	} {
		errw.Reset()
		if got := sidecarMain(c.args, &out, &errw); got != c.code {
			t.Errorf("%v: exit %d, want %d (%s)", c.args, got, c.code, errw.String())
		}
	}
}
