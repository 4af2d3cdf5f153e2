package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	stest "github.com/zentinelproxy/sidecar/internal/supervisor/supervisortest"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// moduleRoot is the repository's root (cmd/sidecar/../..).
func moduleRoot(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// TestVersionStamped builds the binary as the Dockerfile and CI do, with
// the version, commit and date given to the linker: `sidecar version`
// and /status carry them.
func TestVersionStamped(t *testing.T) {
	const pkg = "github.com/zentinelproxy/sidecar/internal/version"
	bin := filepath.Join(t.TempDir(), "sidecar")
	cmd := exec.Command("go", "build", "-trimpath", "-tags", "nowaf", "-o", bin,
		"-ldflags", "-s -w -X "+pkg+".Version=v9.8.7 -X "+pkg+".Commit=0123456789abcdef0123456789abcdef01234567 -X "+pkg+".Date=2026-05-09T07:30:00Z",
		"./cmd/sidecar")
	cmd.Dir = moduleRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	want := "sidecar v9.8.7 (commit 0123456789ab, "
	if !strings.HasPrefix(string(out), want) || !strings.Contains(string(out), "2026-05-09T07:30:00Z, go1.") {
		t.Fatalf("sidecar version: %q, want %q… with the date and Go version", out, want)
	}

	p := testutil.StartSidecar(t, exec.Command(bin, "run", "-config", oneRouteConfig(t)))
	code, st := stest.GetJSON(t, "http://"+p.Admin+"/status")
	if code != 200 || st["version"] != "v9.8.7" || st["commit"] != "0123456789abcdef0123456789abcdef01234567" || st["commit_date"] != "2026-05-09T07:30:00Z" {
		t.Errorf("/status: %d version %v commit %v commit_date %v", code, st["version"], st["commit"], st["commit_date"])
	}
	v := stest.Scrape(t, "http://"+p.Admin)
	found := false
	for k := range v {
		found = found || strings.HasPrefix(k, "sidecar_build_info{") && strings.Contains(k, `version="v9.8.7"`)
	}
	if !found {
		t.Error("sidecar_build_info does not carry the version")
	}
}

// TestVersionFromVCS: a plain `go build` in a git checkout, without
// linker flags, names the checkout's revision rather than "(devel)".
func TestVersionFromVCS(t *testing.T) {
	root := moduleRoot(t)
	// The toolchain finds git only where .git is a directory: not in a
	// worktree made by `git worktree add` (.git is a file there).
	if fi, err := os.Stat(filepath.Join(root, ".git")); err != nil || !fi.IsDir() {
		t.Skip("not the root of a git clone: the toolchain records no revision")
	}
	git := exec.Command("git", "rev-parse", "HEAD")
	git.Dir = root
	rev, err := git.Output()
	if err != nil {
		t.Skipf("git rev-parse: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "sidecar")
	// -buildvcs=true: the default (auto) is on, but GOFLAGS may turn it off.
	build := exec.Command("go", "build", "-buildvcs=true", "-o", bin, "./cmd/sidecar")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		t.Fatalf("version: %v\n%s", err, out)
	}
	if want := "(commit " + string(rev[:12]) + ", "; !strings.Contains(string(out), want) || strings.Contains(string(out), "(devel)") {
		t.Fatalf("sidecar version: %q, want the revision %s and a version", out, rev[:12])
	}
}
