package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// object is a decoded manifest.
type object map[string]any

// get walks a path of map keys and list indices.
func (o object) get(path ...any) any {
	var cur any = map[string]any(o)
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := cur.(map[string]any)
			if !ok {
				return nil
			}
			cur = m[k]
		case int:
			l, ok := cur.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			cur = l[k]
		}
	}
	return cur
}

func (o object) str(path ...any) string {
	s, _ := o.get(path...).(string)
	return s
}

func (o object) list(path ...any) []object {
	l, _ := o.get(path...).([]any)
	out := make([]object, 0, len(l))
	for _, x := range l {
		if m, ok := x.(map[string]any); ok {
			out = append(out, object(m))
		}
	}
	return out
}

// manifests decodes every YAML document under dir.
func manifests(t *testing.T, dir string) map[string][]object {
	t.Helper()
	out := map[string][]object{}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml") {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var m map[string]any
			if err := dec.Decode(&m); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if m != nil {
				out[path] = append(out[path], object(m))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no manifests under %s", dir)
	}
	return out
}

func byKind(all map[string][]object, kind string) []object {
	var out []object
	for _, docs := range all {
		for _, d := range docs {
			if d.str("kind") == kind {
				out = append(out, d)
			}
		}
	}
	return out
}

// sidecarConfig is the part of the sidecar configuration the manifests
// must agree with.
type sidecarConfig struct {
	Listeners []struct {
		Address string `yaml:"address"`
	} `yaml:"listeners"`
	Agents []struct {
		Name      string `yaml:"name"`
		Transport string `yaml:"transport"`
		Address   string `yaml:"address"`
	} `yaml:"agents"`
	Admin struct {
		Address string `yaml:"address"`
	} `yaml:"admin"`
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

func containerPort(c object, name string) string {
	for _, p := range c.list("ports") {
		if p.str("name") == name {
			return fmt.Sprint(p.get("containerPort"))
		}
	}
	return ""
}

func mountPath(c object, volume string) string {
	for _, m := range c.list("volumeMounts") {
		if m.str("name") == volume {
			return m.str("mountPath")
		}
	}
	return ""
}

func TestKubernetesExample(t *testing.T) {
	all := manifests(t, "kubernetes")
	deps := byKind(all, "Deployment")
	cms := byKind(all, "ConfigMap")
	svcs := byKind(all, "Service")
	if len(deps) != 1 || len(cms) != 1 || len(svcs) != 1 {
		t.Fatalf("want one Deployment, ConfigMap and Service; got %d, %d, %d", len(deps), len(cms), len(svcs))
	}
	dep, cm, svc := deps[0], cms[0], svcs[0]
	spec := object(dep.get("spec", "template", "spec").(map[string]any))

	var cfg sidecarConfig
	raw := cm.str("data", "sidecar.yaml")
	if err := yaml.Unmarshal([]byte(raw), &cfg); err != nil {
		t.Fatalf("ConfigMap sidecar.yaml: %v", err)
	}
	// The sidecar itself accepts it.
	if _, err := config.Parse([]byte(raw)); err != nil {
		t.Fatalf("ConfigMap sidecar.yaml: %v", err)
	}
	if len(cfg.Listeners) == 0 || cfg.Admin.Address == "" {
		t.Fatalf("ConfigMap sidecar.yaml lacks a listener or admin.address: %+v", cfg)
	}
	if h, _, _ := net.SplitHostPort(cfg.Admin.Address); h == "127.0.0.1" || h == "localhost" {
		t.Errorf("admin address %s is loopback: the kubelet's probes cannot reach it", cfg.Admin.Address)
	}

	if spec.get("securityContext", "runAsNonRoot") != true {
		t.Error("pod securityContext.runAsNonRoot is not true")
	}
	volumes := map[string]object{}
	for _, v := range spec.list("volumes") {
		volumes[v.str("name")] = v
	}

	var sidecar, agent object
	for _, c := range spec.list("containers") {
		name := c.str("name")
		if c.get("securityContext", "readOnlyRootFilesystem") != true {
			t.Errorf("container %s: readOnlyRootFilesystem is not true", name)
		}
		if c.get("securityContext", "allowPrivilegeEscalation") != false {
			t.Errorf("container %s: allowPrivilegeEscalation is not false", name)
		}
		for _, k := range []string{"requests", "limits"} {
			if c.get("resources", k, "cpu") == nil || c.get("resources", k, "memory") == nil {
				t.Errorf("container %s: resources.%s lacks cpu or memory", name, k)
			}
		}
		if slices.Contains(c.get("args").([]any), any("/etc/sidecar/sidecar.yaml")) {
			sidecar = c
		}
		if mountPath(c, "sockets") != "" && c.str("name") != "sidecar" {
			agent = c
		}
	}
	if sidecar == nil || agent == nil {
		t.Fatal("no sidecar container (run -config /etc/sidecar/sidecar.yaml) or no agent container sharing the sockets volume")
	}

	// Probes: liveness on /healthz, readiness on /readyz, both on the
	// admin port of the configuration.
	adminPort := containerPort(sidecar, "admin")
	if adminPort != port(t, cfg.Admin.Address) {
		t.Errorf("container port admin %s, configured admin address %s", adminPort, cfg.Admin.Address)
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		if got := sidecar.str(probe, "httpGet", "path"); got != path {
			t.Errorf("%s path %q, want %q", probe, got, path)
		}
		if got := fmt.Sprint(sidecar.get(probe, "httpGet", "port")); got != "admin" {
			t.Errorf("%s port %q, want admin", probe, got)
		}
	}
	if got := containerPort(sidecar, "http"); got != port(t, cfg.Listeners[0].Address) {
		t.Errorf("container port http %s, listener %s", got, cfg.Listeners[0].Address)
	}
	if tp := svc.str("spec", "ports", 0, "targetPort"); containerPort(sidecar, tp) == "" {
		t.Errorf("Service targetPort %q is no port of the sidecar", tp)
	}

	// The config volume is the ConfigMap; the socket directory an
	// emptyDir both containers mount at the same path, holding every
	// uds agent's socket.
	if got := volumes["config"].str("configMap", "name"); got != cm.str("metadata", "name") {
		t.Errorf("config volume names ConfigMap %q, the ConfigMap is %q", got, cm.str("metadata", "name"))
	}
	if mountPath(sidecar, "config") != "/etc/sidecar" {
		t.Error("the ConfigMap is not mounted at /etc/sidecar")
	}
	if volumes["sockets"].get("emptyDir") == nil {
		t.Error("the sockets volume is not an emptyDir")
	}
	dir := mountPath(sidecar, "sockets")
	if dir == "" || mountPath(agent, "sockets") != dir {
		t.Errorf("sockets mounted at %q (sidecar) and %q (agent)", dir, mountPath(agent, "sockets"))
	}
	for _, a := range cfg.Agents {
		if a.Transport == "uds" && filepath.Dir(a.Address) != dir {
			t.Errorf("agent %s socket %s is outside the shared directory %s", a.Name, a.Address, dir)
		}
	}
	if !slices.ContainsFunc(agent.get("args").([]any), func(x any) bool {
		s, _ := x.(string)
		return strings.HasPrefix(s, dir+"/")
	}) {
		t.Errorf("agent container args %v do not place its socket in %s", agent.get("args"), dir)
	}
	selector := dep.get("spec", "selector", "matchLabels").(map[string]any)
	for k, v := range selector {
		if dep.get("spec", "template", "metadata", "labels", k) != v || svc.get("spec", "selector", k) != v {
			t.Errorf("label %s=%v is not on the pod template and the Service selector", k, v)
		}
	}
}

// stage is one FROM of a Dockerfile and its instructions.
type stage struct {
	from, name string
	lines      []string // instructions, continuation lines joined
}

// dockerStages splits a Dockerfile into its stages.
func dockerStages(text string) []*stage {
	var out []*stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		if f := strings.Fields(line); f[0] == "FROM" {
			st := &stage{from: f[1]}
			if len(f) == 4 && strings.EqualFold(f[2], "AS") {
				st.name = f[3]
			}
			out = append(out, st)
			return
		}
		if len(out) > 0 {
			out[len(out)-1].lines = append(out[len(out)-1].lines, line)
		}
	}
	for _, l := range strings.Split(text, "\n") {
		if t := strings.TrimSpace(l); strings.HasPrefix(t, "#") {
			continue
		}
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(c + " ")
			continue
		}
		cur.WriteString(l)
		flush()
	}
	flush()
	return out
}

// versionVars are the package-level variables of internal/version.
func versionVars(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../internal/version/version.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.VAR {
			for _, sp := range g.Specs {
				for _, n := range sp.(*ast.ValueSpec).Names {
					out[n.Name] = true
				}
			}
		}
	}
	return out
}

// TestDockerfile keeps the Dockerfile's build line identical to CI's,
// the version stamped from build arguments into variables that exist,
// each binary built in its own stage from the sources alone with the
// module and build caches mounted, and the image non-root with the
// socket volume.
func TestDockerfile(t *testing.T) {
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := os.ReadFile("../.ci/run")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(df), "\\\n", " ")
	build := regexp.MustCompile(`CGO_ENABLED=0 go build (.*) -o \S+ \./cmd/sidecar`)
	d, c := build.FindStringSubmatch(text), build.FindStringSubmatch(string(ci))
	if d == nil || c == nil {
		t.Fatalf("build line missing: Dockerfile %q, CI %q", d, c)
	}
	const pkg = "github.com/zentinelproxy/sidecar/internal/version"
	want := `-trimpath -tags nowaf -ldflags="-s -w -X ` + pkg + `.Version=${VERSION} -X ` + pkg + `.Commit=${COMMIT} -X ` + pkg + `.Date=${DATE}"`
	if d[1] != c[1] || d[1] != want {
		t.Errorf("build flags differ:\nDockerfile %s\nCI         %s\nwant       %s", d[1], c[1], want)
	}
	// A -X naming a variable that does not exist is silently ignored by
	// the linker.
	vars := versionVars(t)
	for _, m := range regexp.MustCompile(`-X `+regexp.QuoteMeta(pkg)+`\.(\w+)=\$\{(\w+)\}`).FindAllStringSubmatch(want, -1) {
		if !vars[m[1]] {
			t.Errorf("-X %s.%s: no such variable in internal/version", pkg, m[1])
		}
		for _, src := range []struct{ name, text string }{{"Dockerfile", text}, {".ci/run", string(ci)}} {
			decl := "ARG " + m[2]
			if src.name == ".ci/run" {
				decl = m[2] + "="
			}
			if !strings.Contains(src.text, decl) {
				t.Errorf("%s does not set %s", src.name, m[2])
			}
		}
	}

	stages := dockerStages(string(df))
	byName := map[string]*stage{}
	for _, st := range stages {
		if st.name != "" {
			byName[st.name] = st
		}
	}
	if b := byName["base"]; b == nil || b.from != "golang:1.26" {
		t.Fatalf("no stage base FROM golang:1.26: %+v", b)
	}
	for _, st := range stages {
		for _, l := range st.lines {
			if !strings.HasPrefix(l, "RUN") {
				continue
			}
			if strings.Contains(l, "go build") || strings.Contains(l, "go mod download") {
				if !strings.Contains(l, "--mount=type=cache,target=/go/pkg/mod") {
					t.Errorf("stage %s: %q does not mount the module cache", st.name, l)
				}
			}
			if strings.Contains(l, "go build") && !strings.Contains(l, "--mount=type=cache,target=/root/.cache/go-build") {
				t.Errorf("stage %s: %q does not mount the build cache", st.name, l)
			}
		}
		// A stage that builds one binary starts from the sources, not
		// from a stage that built another.
		if strings.HasPrefix(st.name, "build") && st.from != "base" {
			t.Errorf("stage %s is FROM %s, not base: it would build that stage's binary too", st.name, st.from)
		}
		builds := 0
		for _, l := range st.lines {
			builds += strings.Count(l, "go build")
		}
		if builds > 1 {
			t.Errorf("stage %s builds %d binaries", st.name, builds)
		}
	}
	// The agent images do not depend on the sidecar's build.
	for _, name := range []string{"corazawaf", "wafagent"} {
		st := byName[name]
		if st == nil {
			t.Errorf("no stage %s", name)
			continue
		}
		for _, l := range st.lines {
			if strings.Contains(l, "--from=build ") {
				t.Errorf("stage %s copies from the sidecar's build: %q", name, l)
			}
		}
	}

	final := text[strings.LastIndex(text, "\nFROM "):]
	for _, want := range []string{
		"FROM gcr.io/distroless/static:nonroot\n",
		"USER 65532:65532",
		`VOLUME ["/run/sidecar"]`,
		"EXPOSE 8080 9901",
		`ENTRYPOINT ["/sidecar"]`,
	} {
		if !strings.Contains(final, want) {
			t.Errorf("the final stage lacks %q", want)
		}
	}
	ignore, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".git", "**/*.test"} {
		if !slices.Contains(strings.Split(string(ignore), "\n"), want) {
			t.Errorf(".dockerignore lacks %s", want)
		}
	}
}
