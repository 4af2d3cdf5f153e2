package agentcheck

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// brokenBin is testdata/brokenagent, built once by TestMain.
// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBinaries()
	os.Exit(code)
}

// brokenAgent is the deliberately broken agent of testdata/brokenagent.
func brokenAgent(t *testing.T) string {
	return testutil.BuildBinary(t, "./internal/agentcheck/testdata/brokenagent")
}

// startProc starts a process and stops it (by its pid) at the end of t.
func startProc(t *testing.T, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-waited
		}
	})
	return cmd
}

// waitSocket waits until something accepts on addr, bounded.
func waitSocket(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		nc, err := net.DialTimeout("unix", addr, time.Second)
		if err == nil {
			_ = nc.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s: %v", addr, err)
		}
		time.Sleep(delay)
	}
}

// startBroken runs the broken agent in mode on a Unix socket.
func startBroken(t *testing.T, mode string) (addr string, pid int) {
	t.Helper()
	addr = filepath.Join(testutil.SocketDir(t), "b.sock")
	cmd := startProc(t, brokenAgent(t), "-mode", mode, "-socket", addr)
	waitSocket(t, addr)
	return addr, cmd.Process.Pid
}

// TestBrokenAgents: each deliberately broken agent gets the FAIL or WARN
// of the rule it breaks, and the checks it does not break still PASS.
func TestBrokenAgents(t *testing.T) {
	cases := []struct {
		mode   string
		only   []string
		check  string
		want   Status
		detail string
	}{
		{"wrongpong", []string{"ping", "correlation"}, "ping", Fail, "must echo"},
		{"serial", []string{"concurrency", "ping"}, "concurrency", Fail, "one at a time"},
		{"ignorecancel", []string{"cancel", "ping"}, "cancel", Warn, "kept working on cancelled requests"},
		{"ignorecancel", []string{"cancel-all"}, "cancel-all", Warn, "kept working on cancelled requests"},
		{"wrongphase", []string{"phases", "ping"}, "phases", Fail, "a BodyMutation answers a header event"},
		{"crashearly", []string{"early-close"}, "early-close", Fail, "gone"},
		{"spinearly", []string{"early-close"}, "early-close", Fail, "spinning"},
	}
	for _, c := range cases {
		t.Run(c.mode+"/"+c.check, func(t *testing.T) {
			addr, pid := startBroken(t, c.mode)
			rep := run(t, Config{Address: addr, PID: pid, Only: c.only})
			r := rep.Find(c.check)
			if r == nil || r.Status != c.want || !strings.Contains(r.Detail, c.detail) {
				dump(t, rep)
				t.Fatalf("%s: got %+v, want %s with %q", c.check, r, c.want, c.detail)
			}
			if len(r.Sent) == 0 && c.check != "early-close" {
				t.Errorf("%s: no evidence of what was sent", c.check)
			}
			if !strings.Contains(r.Rule, "docs/protocol.md §") {
				t.Errorf("rule %q", r.Rule)
			}
			for _, x := range rep.Results {
				if x.ID != c.check && x.Status != Pass {
					t.Errorf("%s: %s %s (only %s is broken)", x.ID, x.Status, x.Detail, c.check)
				}
			}
			if rep.Failed() != (c.want == Fail) {
				t.Errorf("Failed() = %v", rep.Failed())
			}
		})
	}
}

// TestBrokenGoodMode: the same program without a broken rule passes
// everything, so the failures above are the rule's, not the program's.
func TestBrokenGoodMode(t *testing.T) {
	addr, pid := startBroken(t, "good")
	wantAllPass(t, run(t, Config{Address: addr, PID: pid}))
}

// TestLeakingAgent: an agent that keeps state for every request fails the
// soak with the memory numbers; the same soak of the good mode passes.
func TestLeakingAgent(t *testing.T) {
	for _, c := range []struct {
		mode string
		want Status
	}{{"leak", Fail}, {"good", Pass}} {
		t.Run(c.mode, func(t *testing.T) {
			addr, pid := startBroken(t, c.mode)
			// The leak adds about 16 KiB a request, some 90 MiB; the good mode
			// grows by a few MiB while its heap warms up.
			rep := run(t, Config{Address: addr, PID: pid, SkipChecks: true, Requests: 3000, LeakMinBytes: 24 << 20})
			r := rep.Find("soak")
			if r == nil || r.Status != c.want {
				dump(t, rep)
				t.Fatalf("soak: %+v", r)
			}
			t.Logf("%s: %s", c.mode, r.Detail)
			if len(rep.Soak.RSS) < 4 || rep.Soak.Requests != 3000 || rep.Soak.Errors != 0 {
				t.Fatalf("soak report: %+v", rep.Soak)
			}
			if c.want == Fail && (!strings.Contains(r.Detail, "leak") || rep.Soak.RSSGrowthBytes < 24<<20) {
				t.Fatalf("leak not reported with numbers: %s (growth %d bytes)", r.Detail, rep.Soak.RSSGrowthBytes)
			}
		})
	}
}

// TestReverseNoBackoff: a reverse agent that dials again at once after a
// refusal fails the reconnect check; one with a backoff passes it.
func TestReverseNoBackoff(t *testing.T) {
	for _, c := range []struct {
		mode string
		want Status
	}{{"nobackoff", Fail}, {"good", Pass}} {
		t.Run(c.mode, func(t *testing.T) {
			addr := filepath.Join(testutil.SocketDir(t), "r.sock")
			cmd := startProc(t, brokenAgent(t), "-mode", c.mode, "-reverse", addr)
			rep := run(t, Config{Transport: TransportReverse, Address: addr, PID: cmd.Process.Pid, Only: []string{"registration", "reconnect", "ping"}, ReconnectWait: 10 * time.Second})
			r := rep.Find("reconnect")
			if r == nil || r.Status != c.want {
				dump(t, rep)
				t.Fatalf("reconnect: %+v", r)
			}
			if p := rep.Find("registration"); p == nil || p.Status != Pass {
				t.Errorf("registration: %+v", p)
			}
		})
	}
}

// TestMuteAgent: an agent that answers Pings but no event fails the
// checks that need answers within their bound, and the soak stops early
// instead of waiting out every request.
func TestMuteAgent(t *testing.T) {
	addr, pid := startBroken(t, "mute")
	rep := run(t, Config{Address: addr, PID: pid, Timeout: 300 * time.Millisecond, Only: []string{"ping", "correlation", "phases"}, Requests: 100000})
	for id, want := range map[string]Status{"ping": Pass, "correlation": Fail, "phases": Fail, "soak": Fail} {
		if r := rep.Find(id); r == nil || r.Status != want {
			dump(t, rep)
			t.Fatalf("%s: %+v, want %s", id, r, want)
		}
	}
	if rep.Soak == nil || rep.Soak.Requests >= 1000 || rep.Soak.Errors < maxSoakErrors {
		t.Fatalf("soak did not stop early: %+v", rep.Soak)
	}
}

// TestAnswersToNoRequest: an agent that answers every frame it cannot use
// (an unknown type, a misdirected HandshakeResponse or Decision, an event
// that does not decode, with or without a readable request_id) with
// {"request_id":0,"decision":"allow"} FAILs each of those checks, over a
// Unix socket and a reverse connection, with that frame as evidence; the
// checks it does not break still PASS.
func TestAnswersToNoRequest(t *testing.T) {
	const stray = `0x20 Decision {"request_id":0,"decision":"allow"}`
	broken := map[string]int{"unknown-frames": 3, "malformed-json": 1, "malformed-noid": 1} // answers sent
	only := []string{"ping", "unknown-frames", "correlation", "phases", "malformed-json", "malformed-noid"}
	for _, tr := range []string{TransportUDS, TransportReverse} {
		t.Run(tr, func(t *testing.T) {
			var rep *Report
			if tr == TransportUDS {
				addr, pid := startBroken(t, "answerall")
				rep = run(t, Config{Address: addr, PID: pid, Only: only})
			} else {
				addr := filepath.Join(testutil.SocketDir(t), "r.sock")
				cmd := startProc(t, brokenAgent(t), "-mode", "answerall", "-reverse", addr)
				rep = run(t, Config{Transport: TransportReverse, Address: addr, PID: cmd.Process.Pid, Only: append([]string{"registration"}, only...), ReconnectWait: 10 * time.Second})
			}
			for _, r := range rep.Results {
				n, bad := broken[r.ID]
				if !bad {
					if r.Status != Pass {
						dump(t, rep)
						t.Errorf("%s: %s %s (only the answers to frames it should skip are broken)", r.ID, r.Status, r.Detail)
					}
					continue
				}
				want := "sent 1 answer for requests it was never sent (request_id 0)"
				if n > 1 {
					want = fmt.Sprintf("sent %d answers for requests it was never sent (request_id 0)", n)
				}
				if r.Status != Fail || !strings.Contains(r.Detail, want) {
					dump(t, rep)
					t.Errorf("%s: %s %q, want FAIL naming %d answers for request_id 0", r.ID, r.Status, r.Detail, n)
				}
				if !slices.Contains(r.Received, stray) {
					t.Errorf("%s: the answer is not in the evidence: %q", r.ID, r.Received)
				}
				if len(r.Sent) == 0 || !strings.Contains(r.Rule, "docs/protocol.md §") {
					t.Errorf("%s: sent %q, rule %q", r.ID, r.Sent, r.Rule)
				}
				delete(broken, r.ID)
			}
			if len(broken) != 0 {
				t.Errorf("not run: %v", broken)
			}
			broken = map[string]int{"unknown-frames": 3, "malformed-json": 1, "malformed-noid": 1}
			if !rep.Failed() {
				t.Error("Failed() = false")
			}
		})
	}
}
