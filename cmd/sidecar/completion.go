package main

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/zentinelproxy/sidecar/internal/agentcheck"
)

const completionSynopsis = `sidecar completion bash|zsh|fish

Prints the shell completion script of the sidecar's commands, flags and
their values:

  source <(sidecar completion bash)                          # bash, or in ~/.bashrc
  sidecar completion zsh > "${fpath[1]}/_sidecar"            # zsh, then restart it
  sidecar completion fish > ~/.config/fish/completions/sidecar.fish`

// commands are the commands completed, with what they do.
var commands = []struct{ name, desc string }{
	{"run", "serve a configuration file"},
	{"check-config", "validate a configuration file as run would"},
	{"demo", "run a self-contained demo"},
	{"agent-check", "check an agent against the protocol"},
	{"sleep", "wait, then exit (a preStop hook)"},
	{"version", "print the version"},
	{"completion", "print a shell completion script"},
	{"help", "print the usage"},
}

// logLevels are the values of -log-level.
var logLevels = []string{"trace", "debug", "info", "warn", "error"}

// flagValues are the values a flag takes, by "command -flag".
var flagValues = map[string][]string{
	"run -log-level":                logLevels,
	"run -log-format":               {"json", "console"},
	"run -gomaxprocs":               {"adaptive", "runtime"},
	"run -sched":                    {"normal", "batch"},
	"demo -agent":                   {"demo", "waf"},
	"demo -agent-transport":         {"uds", "grpc", "reverse"},
	"demo -log-level":               logLevels,
	"agent-check -transport":        {"uds", "grpc", "reverse"},
	"agent-check -payload-encoding": {"json", "protobuf"},
	"agent-check -only":             agentcheck.CheckIDs(),
}

// fileFlags take a file name, by "command -flag".
var fileFlags = map[string]bool{
	"run -config":          true,
	"agent-check -expect":  true,
	"agent-check -address": true,
}

// argValues are what a command's arguments are: files, or words.
var argValues = map[string][]string{
	"completion": {"bash", "zsh", "fish"},
}

// fileArgs are the commands whose argument is a file.
var fileArgs = map[string]bool{"check-config": true}

// flagLine is a flag in flag.PrintDefaults' output: the name, the type
// of its value (absent for a boolean), then its usage on the next line.
var flagLine = regexp.MustCompile(`(?m)^  -([A-Za-z0-9][A-Za-z0-9-]*)( [^\n]+)?\n\s+(.*)$`)

// cliFlag is one flag of a command.
type cliFlag struct {
	name  string // with its dash
	value bool   // takes a value (not a boolean)
	usage string // the first words of its usage
}

// commandFlags returns a command's flags, read from its own usage, so
// that the scripts follow the flag sets.
func commandFlags(cmd string) []cliFlag {
	switch cmd {
	case "version", "help", "completion":
		return nil
	}
	var out, errw bytes.Buffer
	sidecarMain([]string{cmd, "-h"}, &out, &errw)
	var flags []cliFlag
	for _, m := range flagLine.FindAllStringSubmatch(errw.String(), -1) {
		usage, _, _ := strings.Cut(m[3], " (")
		usage, _, _ = strings.Cut(usage, ": ")
		if len(usage) > 60 {
			usage = usage[:57] + "..."
		}
		flags = append(flags, cliFlag{name: "-" + m[1], value: m[2] != "", usage: usage})
	}
	return flags
}

func completionCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("completion", completionSynopsis, stderr)
	if err := parseFlags(fs, args, 1); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "completion: the shell is required")
		fs.Usage()
		return errUsage
	}
	if err := oneOf(fs, "shell", fs.Arg(0), "bash", "zsh", "fish"); err != nil {
		return err
	}
	var b strings.Builder
	switch fs.Arg(0) {
	case "bash":
		bashCompletion(&b)
	case "zsh":
		zshCompletion(&b)
	case "fish":
		fishCompletion(&b)
	}
	_, err := io.WriteString(stdout, b.String())
	return err
}

func commandNames() []string {
	var out []string
	for _, c := range commands {
		out = append(out, c.name)
	}
	return out
}

func bashCompletion(b *strings.Builder) {
	b.WriteString(`# bash completion of sidecar: source <(sidecar completion bash)
_sidecar() {
    local cur prev cmd
    cur="${COMP_WORDS[COMP_CWORD]}"
    prev="${COMP_WORDS[COMP_CWORD-1]}"
    if [[ ${COMP_CWORD} -eq 1 ]]; then
        COMPREPLY=($(compgen -W "` + strings.Join(commandNames(), " ") + ` -config" -- "${cur}"))
        return
    fi
    cmd="${COMP_WORDS[1]}"
    [[ ${cmd} == -config ]] && cmd=run
    case "${cmd} ${prev}" in
`)
	for _, k := range slices.Sorted(maps.Keys(flagValues)) {
		fmt.Fprintf(b, "        %q) COMPREPLY=($(compgen -W %q -- \"${cur}\")); return ;;\n", k, strings.Join(flagValues[k], " "))
	}
	for _, k := range slices.Sorted(maps.Keys(fileFlags)) {
		fmt.Fprintf(b, "        %q) compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- \"${cur}\")); return ;;\n", k)
	}
	b.WriteString("    esac\n    case \"${cmd}\" in\n")
	for _, c := range commands {
		flags := commandFlags(c.name)
		var names []string
		for _, f := range flags {
			names = append(names, f.name)
		}
		words := strings.Join(names, " ")
		switch {
		case fileArgs[c.name]:
			fmt.Fprintf(b, "        %s) if [[ ${cur} == -* ]]; then COMPREPLY=($(compgen -W %q -- \"${cur}\")); else compopt -o filenames 2>/dev/null; COMPREPLY=($(compgen -f -- \"${cur}\")); fi ;;\n", c.name, words)
		case argValues[c.name] != nil:
			fmt.Fprintf(b, "        %s) [[ ${COMP_CWORD} -eq 2 ]] && COMPREPLY=($(compgen -W %q -- \"${cur}\")) ;;\n", c.name, strings.Join(argValues[c.name], " "))
		case len(flags) > 0:
			fmt.Fprintf(b, "        %s) COMPREPLY=($(compgen -W %q -- \"${cur}\")) ;;\n", c.name, words)
		}
	}
	b.WriteString("    esac\n}\ncomplete -F _sidecar sidecar\n")
}

// zshQuote quotes s for a single-quoted zsh word inside an _arguments
// spec (the description's brackets and colons escaped).
func zshQuote(s string) string {
	s = strings.NewReplacer(`'`, `'\''`, "[", `\[`, "]", `\]`, ":", `\:`).Replace(s)
	return s
}

func zshCompletion(b *strings.Builder) {
	b.WriteString("#compdef sidecar\n# zsh completion of sidecar: sidecar completion zsh > \"${fpath[1]}/_sidecar\"\n_sidecar() {\n    local -a cmds\n    cmds=(\n")
	for _, c := range commands {
		fmt.Fprintf(b, "        '%s:%s'\n", c.name, zshQuote(c.desc))
	}
	b.WriteString("    )\n    if (( CURRENT == 2 )); then\n        _describe 'command' cmds\n        return\n    fi\n    local cmd=${words[2]}\n    shift words\n    (( CURRENT-- ))\n    case ${cmd} in\n")
	for _, c := range commands {
		flags := commandFlags(c.name)
		var specs []string
		for _, f := range flags {
			key := c.name + " " + f.name
			spec := fmt.Sprintf("'%s[%s]", f.name, zshQuote(f.usage))
			switch {
			case flagValues[key] != nil:
				spec += fmt.Sprintf(":value:(%s)", strings.Join(flagValues[key], " "))
			case fileFlags[key]:
				spec += ":file:_files"
			case f.value:
				spec += ":value: "
			}
			specs = append(specs, spec+"'")
		}
		switch {
		case fileArgs[c.name]:
			specs = append(specs, "':file:_files'")
		case argValues[c.name] != nil:
			specs = append(specs, fmt.Sprintf("':value:(%s)'", strings.Join(argValues[c.name], " ")))
		}
		if len(specs) > 0 {
			fmt.Fprintf(b, "        %s) _arguments %s ;;\n", c.name, strings.Join(specs, " "))
		}
	}
	b.WriteString("    esac\n}\nif [[ $zsh_eval_context[-1] == loadautofunc ]]; then\n    _sidecar \"$@\"\nelse\n    compdef _sidecar sidecar\nfi\n")
}

func fishCompletion(b *strings.Builder) {
	b.WriteString("# fish completion of sidecar: sidecar completion fish > ~/.config/fish/completions/sidecar.fish\ncomplete -c sidecar -f\n")
	for _, c := range commands {
		fmt.Fprintf(b, "complete -c sidecar -n __fish_use_subcommand -a %s -d %s\n", c.name, fishQuote(c.desc))
	}
	for _, c := range commands {
		cond := fishQuote("__fish_seen_subcommand_from " + c.name)
		for _, f := range commandFlags(c.name) {
			key := c.name + " " + f.name
			line := fmt.Sprintf("complete -c sidecar -n %s -o %s -d %s", cond, f.name[1:], fishQuote(f.usage))
			switch {
			case flagValues[key] != nil:
				line += " -x -a " + fishQuote(strings.Join(flagValues[key], " "))
			case fileFlags[key]:
				line += " -r -F"
			case f.value:
				line += " -x"
			}
			b.WriteString(line + "\n")
		}
		switch {
		case fileArgs[c.name]:
			fmt.Fprintf(b, "complete -c sidecar -n %s -F\n", cond)
		case argValues[c.name] != nil:
			fmt.Fprintf(b, "complete -c sidecar -n %s -x -a %s\n", cond, fishQuote(strings.Join(argValues[c.name], " ")))
		}
	}
}

func fishQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `\'`) + "'" }
