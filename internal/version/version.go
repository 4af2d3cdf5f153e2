// Package version says which build of the sidecar is running: the
// version, the commit and its date, for `sidecar version`, /status and
// sidecar_build_info.
//
// A release build stamps them with the linker:
//
//	go build -ldflags "-X github.com/zentinelproxy/sidecar/internal/version.Version=v0.3.0 \
//	  -X github.com/zentinelproxy/sidecar/internal/version.Commit=$(git rev-parse HEAD) \
//	  -X github.com/zentinelproxy/sidecar/internal/version.Date=$(git log -1 --format=%cI)" ./cmd/sidecar
//
// (the Dockerfile takes them as build arguments, .ci/run passes them from
// git). What is not stamped comes from the build information the Go
// toolchain records (runtime/debug.ReadBuildInfo): the module version of
// `go install …@v0.3.0`, or the pseudo-version, revision, commit time and
// modified flag of a `go build` in a git checkout. A build with neither
// (a copy of the sources without .git and no flags, `go run`) is
// "(devel)".
package version

import (
	"runtime"
	"runtime/debug"
	"strings"
)

// Set by the linker (-ldflags -X); empty when not stamped.
var (
	// Version is the release, e.g. v0.3.0.
	Version string
	// Commit is the full revision the binary was built from.
	Commit string
	// Date is the commit's time (RFC 3339), so that two builds of one
	// commit are identical.
	Date string
)

// Devel is the version of a build that carries no version.
const Devel = "(devel)"

// Info describes the running binary.
type Info struct {
	// Version is the stamped version, else the module version, else Devel.
	Version string `json:"version"`
	// Commit is the revision ("" when unknown).
	Commit string `json:"commit,omitempty"`
	// Date is the commit's time ("" when unknown).
	Date string `json:"date,omitempty"`
	// Modified: the checkout had uncommitted changes (from the Go
	// toolchain's build information only).
	Modified bool `json:"modified,omitempty"`
	// GoVersion is the toolchain that built the binary.
	GoVersion string `json:"go_version"`
}

// Get returns the stamped values, falling back to the build information.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(bi, Version, Commit, Date)
}

func get(bi *debug.BuildInfo, v, commit, date string) Info {
	i := Info{Version: strings.TrimSpace(v), Commit: strings.TrimSpace(commit), Date: strings.TrimSpace(date), GoVersion: runtime.Version()}
	if bi != nil {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != Devel {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if i.Commit == "" {
					i.Commit = s.Value
				}
			case "vcs.time":
				if i.Date == "" {
					i.Date = s.Value
				}
			case "vcs.modified":
				i.Modified = s.Value == "true"
			}
		}
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
	}
	if i.Version == "" {
		i.Version = Devel
	}
	return i
}

// String is one line: "v0.3.0 (commit 0123456789ab, modified, 2026-05-09T07:30:00Z, go1.26.8 linux/amd64)".
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	b.WriteString(" (")
	if i.Commit != "" {
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		b.WriteString("commit " + c + ", ")
	}
	if i.Modified {
		b.WriteString("modified, ")
	}
	if i.Date != "" {
		b.WriteString(i.Date + ", ")
	}
	b.WriteString(i.GoVersion + " " + runtime.GOOS + "/" + runtime.GOARCH + ")")
	return b.String()
}
