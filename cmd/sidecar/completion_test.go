package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestCompletionTables: every flag the value and file tables name is a
// flag of its command, so the scripts cannot offer values for a flag that
// was renamed.
func TestCompletionTables(t *testing.T) {
	has := func(key string) bool {
		cmd, flag, _ := strings.Cut(key, " ")
		return slices.ContainsFunc(commandFlags(cmd), func(f cliFlag) bool { return f.name == flag && f.value })
	}
	for k := range flagValues {
		if !has(k) {
			t.Errorf("flagValues: %q is not a flag taking a value", k)
		}
	}
	for k := range fileFlags {
		if !has(k) {
			t.Errorf("fileFlags: %q is not a flag taking a value", k)
		}
	}
	if fl := commandFlags("run"); !slices.ContainsFunc(fl, func(f cliFlag) bool { return f.name == "-config" && f.value && f.usage == "configuration file" }) {
		t.Errorf("run flags %+v", fl)
	}
	for _, c := range commands {
		if code, _, stderr := runMain(c.name, "-h"); code != 0 && c.name != "version" && c.name != "help" {
			t.Errorf("%s -h: exit %d %s", c.name, code, stderr)
		}
	}
	if code, _, stderr := runMain("completion", "tcsh"); code != 2 || !strings.Contains(stderr, `-shell must be bash or zsh or fish, not "tcsh"`) {
		t.Errorf("completion tcsh: exit %d %s", code, stderr)
	}
}

// script writes the completion script for shell to a file.
func script(t *testing.T, shell string) string {
	t.Helper()
	code, stdout, stderr := runMain("completion", shell)
	if code != 0 {
		t.Fatalf("completion %s: exit %d %s", shell, code, stderr)
	}
	p := filepath.Join(t.TempDir(), "sidecar."+shell)
	if err := os.WriteFile(p, []byte(stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestCompletionBash runs the bash script's function on command lines
// and checks what it offers.
func TestCompletionBash(t *testing.T) {
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	p := script(t, "bash")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "sidecar.yaml"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		words []string
		want  []string
	}{
		{[]string{"sidecar", "ch"}, []string{"check-config"}},
		{[]string{"sidecar", "run", "-log-l"}, []string{"-log-level"}},
		{[]string{"sidecar", "run", "-log-level", ""}, []string{"trace", "debug", "info", "warn", "error"}},
		{[]string{"sidecar", "run", "-config", dir + "/sid"}, []string{dir + "/sidecar.yaml"}},
		{[]string{"sidecar", "check-config", dir + "/"}, []string{dir + "/sidecar.yaml"}},
		{[]string{"sidecar", "agent-check", "-transport", "g"}, []string{"grpc"}},
		{[]string{"sidecar", "agent-check", "-only", "cancel"}, []string{"cancel", "cancel-all"}},
		{[]string{"sidecar", "demo", "-agent", ""}, []string{"demo", "waf"}},
		{[]string{"sidecar", "completion", "z"}, []string{"zsh"}},
	} {
		var quoted []string
		for _, w := range c.words {
			quoted = append(quoted, "'"+w+"'")
		}
		prog := "source " + p + "; COMP_WORDS=(" + strings.Join(quoted, " ") + "); COMP_CWORD=" +
			strconv.Itoa(len(c.words)-1) + "; _sidecar; printf '%s\\n' \"${COMPREPLY[@]}\""
		out, err := exec.Command(bash, "--norc", "-c", prog).Output()
		if err != nil {
			t.Fatalf("%v: %v", c.words, err)
		}
		got := strings.Fields(string(out))
		if !slices.Equal(got, c.want) {
			t.Errorf("%v: %v, want %v", c.words, got, c.want)
		}
	}
}

// TestCompletionZshFish: the zsh and fish scripts parse; fish answers
// completions without a terminal.
func TestCompletionZshFish(t *testing.T) {
	if zsh, err := exec.LookPath("zsh"); err == nil {
		if out, err := exec.Command(zsh, "-n", script(t, "zsh")).CombinedOutput(); err != nil {
			t.Errorf("zsh -n: %v %s", err, out)
		}
	} else {
		t.Log("no zsh: its script is not parsed")
	}
	fish, err := exec.LookPath("fish")
	if err != nil {
		t.Skip("no fish")
	}
	p := script(t, "fish")
	if out, err := exec.Command(fish, "-n", p).CombinedOutput(); err != nil {
		t.Fatalf("fish -n: %v %s", err, out)
	}
	for _, c := range []struct{ line, want string }{
		{"sidecar run -log-level ", "trace\tlog level"},
		{"sidecar ag", "agent-check\tcheck an agent against the protocol"},
		{"sidecar agent-check -transport ", "reverse"},
	} {
		out, err := exec.Command(fish, "--no-config", "-c", "source "+p+"; complete -C '"+c.line+"'").Output()
		if err != nil {
			t.Fatalf("%q: %v", c.line, err)
		}
		if !strings.Contains(string(out), c.want) {
			t.Errorf("%q: %q lacks %q", c.line, out, c.want)
		}
	}
}
