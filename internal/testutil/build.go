package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
)

// built caches BuildBinary's binaries per test process.
var built struct {
	sync.Mutex
	dir  string
	bins map[string]string
	errs map[string]error
}

// BuildBinary builds the main package pkg, a path from the module root
// ("./cmd/sidecar"), once per test process and returns the binary's path.
// A package whose tests call it runs RemoveBinaries from its TestMain.
func BuildBinary(t testing.TB, pkg string) string {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if p, ok := built.bins[pkg]; ok {
		return p
	}
	if err, ok := built.errs[pkg]; ok {
		t.Fatal(err)
	}
	p, err := build(pkg)
	if err != nil {
		if built.errs == nil {
			built.errs = map[string]error{}
		}
		built.errs[pkg] = err
		t.Fatal(err)
	}
	if built.bins == nil {
		built.bins = map[string]string{}
	}
	built.bins[pkg] = p
	return p
}

func build(pkg string) (string, error) {
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "testbin")
		if err != nil {
			return "", err
		}
		built.dir = dir
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file))) // internal/testutil/build.go
	out := filepath.Join(built.dir, fmt.Sprintf("%s-%d", filepath.Base(pkg), len(built.bins)))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}

// RemoveBinaries deletes what BuildBinary built; for TestMain, after m.Run.
func RemoveBinaries() {
	built.Lock()
	defer built.Unlock()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	built.dir, built.bins, built.errs = "", nil, nil
}
