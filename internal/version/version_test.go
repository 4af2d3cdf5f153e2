package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	vcs := &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/zentinelproxy/sidecar", Version: "v0.0.0-20260509073000-0123456789ab+dirty"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef0123456789abcdef01234567"},
			{Key: "vcs.time", Value: "2026-05-09T07:30:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	}
	for _, c := range []struct {
		name            string
		bi              *debug.BuildInfo
		v, commit, date string
		want            Info
		wantString      string
	}{
		{"stamped wins", vcs, "v0.3.0", "fedcba9876543210", "2026-06-01T00:00:00Z",
			Info{Version: "v0.3.0", Commit: "fedcba9876543210", Date: "2026-06-01T00:00:00Z", Modified: true, GoVersion: "go1.26.8"},
			"v0.3.0 (commit fedcba987654, modified, 2026-06-01T00:00:00Z, go1.26.8 "},
		{"build info", vcs, "", "", "",
			Info{Version: "v0.0.0-20260509073000-0123456789ab+dirty", Commit: "0123456789abcdef0123456789abcdef01234567", Date: "2026-05-09T07:30:00Z", Modified: true, GoVersion: "go1.26.8"},
			"v0.0.0-20260509073000-0123456789ab+dirty (commit 0123456789ab, modified, 2026-05-09T07:30:00Z, go1.26.8 "},
		{"nothing", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"}}, "", "", "",
			Info{Version: Devel, GoVersion: "go1.26.8"}, "(devel) (go1.26.8 "},
		{"module version", &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.3.0"}}, "", "", "",
			Info{Version: "v0.3.0", GoVersion: "go1.26.8"}, "v0.3.0 (go1.26.8 "},
	} {
		got := get(c.bi, c.v, c.commit, c.date)
		if got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
		if s := got.String(); !strings.HasPrefix(s, c.wantString) {
			t.Errorf("%s: %q, want prefix %q", c.name, s, c.wantString)
		}
	}
}
