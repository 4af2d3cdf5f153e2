package deploy

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// podSpec returns the Deployment's pod spec and its containers by name.
func podSpec(t *testing.T, all map[string][]object) (object, map[string]object) {
	t.Helper()
	deps := byKind(all, "Deployment")
	if len(deps) != 1 {
		t.Fatalf("%d Deployments", len(deps))
	}
	spec := object(deps[0].get("spec", "template", "spec").(map[string]any))
	cs := map[string]object{}
	for _, c := range spec.list("containers") {
		cs[c.str("name")] = c
	}
	if cs["sidecar"] == nil || cs["waf"] == nil {
		t.Fatalf("containers %v: want sidecar and waf", slices.Sorted(maps.Keys(cs)))
	}
	return spec, cs
}

// TestKubernetesImages: every image is pinned (no :latest, no missing
// tag), the project's images are set in one place (the kustomization's
// images) and are not pulled when a locally loaded one is there.
func TestKubernetesImages(t *testing.T) {
	all := manifests(t, "kubernetes")
	_, cs := podSpec(t, all)
	var kust struct {
		Resources []string `yaml:"resources"`
		Images    []struct {
			Name    string `yaml:"name"`
			NewName string `yaml:"newName"`
			NewTag  string `yaml:"newTag"`
		} `yaml:"images"`
	}
	raw, err := os.ReadFile("kubernetes/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &kust); err != nil {
		t.Fatal(err)
	}
	tags := map[string]string{}
	for _, im := range kust.Images {
		if im.NewTag == "" || im.NewTag == "latest" {
			t.Errorf("kustomization image %s: newTag %q", im.Name, im.NewTag)
		}
		tags[im.Name] = im.NewTag
	}
	for name, c := range cs {
		image := c.str("image")
		repo, tag, ok := strings.Cut(image, ":")
		if !ok || tag == "" || tag == "latest" || strings.Contains(tag, "/") {
			t.Errorf("container %s: image %q is not pinned to a version", name, image)
			continue
		}
		if strings.HasPrefix(repo, "zentinelproxy/") {
			if tags[repo] != tag {
				t.Errorf("container %s: image %s, the kustomization sets %s to %q", name, image, repo, tags[repo])
			}
			if c.str("imagePullPolicy") != "IfNotPresent" {
				t.Errorf("container %s: imagePullPolicy %q: an image loaded with kind or minikube would be pulled", name, c.str("imagePullPolicy"))
			}
			delete(tags, repo)
		}
	}
	for repo := range tags {
		t.Errorf("the kustomization sets %s, which no container uses", repo)
	}
	// The kustomization lists every manifest, and only those.
	files, _ := filepath.Glob("kubernetes/*.yaml")
	var want []string
	for _, f := range files {
		if b := filepath.Base(f); b != "kustomization.yaml" {
			want = append(want, b)
		}
	}
	slices.Sort(kust.Resources)
	if !slices.Equal(kust.Resources, want) {
		t.Errorf("kustomization resources %v, manifests %v", kust.Resources, want)
	}
}

// hook returns a container's preStop exec command.
func hook(t *testing.T, c object) []string {
	t.Helper()
	if c.get("lifecycle", "preStop", "sleep") != nil {
		t.Errorf("container %s: the preStop sleep action needs Kubernetes 1.30", c.str("name"))
	}
	cmd, ok := c.get("lifecycle", "preStop", "exec", "command").([]any)
	if !ok {
		t.Fatalf("container %s: no preStop exec command", c.str("name"))
	}
	var out []string
	for _, x := range cmd {
		out = append(out, fmt.Sprint(x))
	}
	return out
}

func duration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("duration %q: %v", s, err)
	}
	return d
}

// flagValue returns the value after -name in a container's args.
func flagValue(c object, name string) string {
	args, _ := c.get("args").([]any)
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "-"+name {
			return fmt.Sprint(args[i+1])
		}
	}
	return ""
}

// TestKubernetesShutdown: the preStop hooks exec a binary of their
// image (Kubernetes before 1.30 has no sleep action, distroless no
// shell); the fail-closed WAF outlives the sidecar's pause and drain, and
// the grace period covers the longest hook.
func TestKubernetesShutdown(t *testing.T) {
	all := manifests(t, "kubernetes")
	spec, cs := podSpec(t, all)
	sc, waf := hook(t, cs["sidecar"]), hook(t, cs["waf"])
	if len(sc) != 3 || sc[0] != "/sidecar" || sc[1] != "sleep" {
		t.Fatalf("sidecar preStop %v, want /sidecar sleep DURATION", sc)
	}
	src, err := os.ReadFile("../cmd/sidecar/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(src), `case "sleep":`) {
		t.Error("cmd/sidecar has no sleep command")
	}
	if len(waf) != 2 || waf[0] != "/sleep" {
		t.Fatalf("waf preStop %v, want /sleep DURATION", waf)
	}
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	var coraza *stage
	for _, st := range dockerStages(string(df)) {
		if st.name == "corazawaf" {
			coraza = st
		}
	}
	if coraza == nil || !slices.Contains(coraza.lines, "COPY --from=build-sleep /out/sleep /sleep") ||
		!strings.Contains(string(df), "-o /out/sleep ./deploy/sleep") {
		t.Error("the corazawaf image has no /sleep built from ./deploy/sleep")
	}
	ignore, _ := os.ReadFile("../.dockerignore")
	if !strings.Contains(string(ignore), "!deploy/sleep\n") {
		t.Error(".dockerignore leaves deploy/sleep out of the build context")
	}

	pause, drain := duration(t, sc[2]), duration(t, flagValue(cs["sidecar"], "drain"))
	wafWait := duration(t, waf[1])
	if wafWait < pause+drain {
		t.Errorf("the WAF's preStop (%v) ends before the sidecar's pause and drain (%v + %v): fail-closed requests would get 503", wafWait, pause, drain)
	}
	grace, _ := spec.get("terminationGracePeriodSeconds").(int)
	if time.Duration(grace)*time.Second <= wafWait {
		t.Errorf("terminationGracePeriodSeconds %d does not cover the WAF's preStop %v", grace, wafWait)
	}
}

// TestKubernetesNetworkPolicy: the admin port (metrics, status, reload)
// is reachable from the monitoring namespace only; the data port from
// anywhere.
func TestKubernetesNetworkPolicy(t *testing.T) {
	all := manifests(t, "kubernetes")
	pols := byKind(all, "NetworkPolicy")
	if len(pols) != 1 {
		t.Fatalf("%d NetworkPolicies", len(pols))
	}
	np := pols[0]
	dep := byKind(all, "Deployment")[0]
	for k, v := range np.get("spec", "podSelector", "matchLabels").(map[string]any) {
		if dep.get("spec", "template", "metadata", "labels", k) != v {
			t.Errorf("podSelector %s=%v does not select the pod", k, v)
		}
	}
	if !slices.Contains(np.get("spec", "policyTypes").([]any), any("Ingress")) {
		t.Error("policyTypes lacks Ingress")
	}
	_, cs := podSpec(t, all)
	httpOpen, adminFrom := false, false
	for _, rule := range np.list("spec", "ingress") {
		for _, p := range rule.list("ports") {
			port := fmt.Sprint(p.get("port"))
			if containerPort(cs["sidecar"], port) == "" {
				t.Errorf("rule port %s is no port of the sidecar", port)
			}
			from := rule.list("from")
			switch port {
			case "http":
				httpOpen = httpOpen || len(from) == 0
			case "admin":
				if len(from) == 0 {
					t.Error("a rule opens the admin port to everyone")
				}
				for _, f := range from {
					ns, _ := f.get("namespaceSelector", "matchLabels").(map[string]any)
					if f.get("ipBlock") != nil || len(ns) == 0 {
						t.Errorf("admin port open to %v: want a namespace selected by its labels", f)
					}
					if ns["kubernetes.io/metadata.name"] == "monitoring" {
						adminFrom = true
					}
				}
			}
		}
	}
	if !httpOpen || !adminFrom {
		t.Errorf("data port open to all %v, admin port open to the monitoring namespace %v", httpOpen, adminFrom)
	}
}

// mebibytes reads a Kubernetes memory quantity (Mi, Gi, M, G, bytes).
func mebibytes(t *testing.T, q string) float64 {
	t.Helper()
	m := regexp.MustCompile(`^(\d+)(Mi|Gi|M|G)?$`).FindStringSubmatch(q)
	if m == nil {
		t.Fatalf("memory quantity %q", q)
	}
	n, _ := strconv.ParseFloat(m[1], 64)
	switch m[2] {
	case "Mi":
		return n
	case "Gi":
		return n * 1024
	case "M":
		return n * 1e6 / (1 << 20)
	case "G":
		return n * 1e9 / (1 << 20)
	}
	return n / (1 << 20)
}

// The memory model of the example, from measurements: the sidecar idles
// at about 27 MiB of RSS; the WAF's rule set and runtime take 58–71 MiB
// and each transaction open between a request and its response about
// 0.26 MiB more (1024 pending: 280–340 MiB, docs/performance.md), plus
// the request body it holds until it is closed.
const (
	sidecarBaseMiB    = 30
	wafBaseMiB        = 75
	wafPerPendingMiB  = 0.3
	memoryMarginRatio = 1.25
)

// TestKubernetesMemory: each container's memory limit covers its worst
// case with a margin: the sidecar's configuration's buffered bodies and
// queues (what check-config compares with the cgroup's limit), the WAF's
// -max-pending transactions with their bodies; and -max-pending is no
// smaller than the requests the sidecar can have open.
func TestKubernetesMemory(t *testing.T) {
	all := manifests(t, "kubernetes")
	_, cs := podSpec(t, all)
	cfg, err := config.Parse([]byte(byKind(all, "ConfigMap")[0].str("data", "sidecar.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.BufferEstimate()
	sidecarLimit := mebibytes(t, cs["sidecar"].str("resources", "limits", "memory"))
	sidecarNeed := memoryMarginRatio * (sidecarBaseMiB + float64(e.Total)/(1<<20))
	if sidecarNeed > sidecarLimit {
		t.Errorf("sidecar: worst case %.0f MiB with its margin (%+v), limit %.0f MiB", sidecarNeed, e, sidecarLimit)
	}

	conns := 0
	for _, l := range cfg.Listeners {
		if l.MaxConnections == 0 {
			t.Fatalf("listener %s has no max_connections: the requests open at once are unbounded", l.Name)
		}
		conns += l.MaxConnections
	}
	pending, err := strconv.Atoi(flagValue(cs["waf"], "max-pending"))
	if err != nil {
		t.Fatalf("waf -max-pending: %v", err)
	}
	if pending < conns {
		t.Errorf("waf -max-pending %d below the %d requests the sidecar can have open: live requests would lose their transaction", pending, conns)
	}
	body, err := strconv.Atoi(flagValue(cs["waf"], "body-limit"))
	if err != nil {
		t.Fatalf("waf -body-limit: %v", err)
	}
	wafLimit := mebibytes(t, cs["waf"].str("resources", "limits", "memory"))
	wafNeed := memoryMarginRatio * (wafBaseMiB + float64(pending)*(wafPerPendingMiB+float64(body)/(1<<20)))
	if wafNeed > wafLimit {
		t.Errorf("waf: -max-pending %d with -body-limit %d needs %.0f MiB with its margin, limit %.0f MiB", pending, body, wafNeed, wafLimit)
	}
	// And not far above it: the limit says how the two relate.
	if wafLimit > 1.5*wafNeed {
		t.Errorf("waf: limit %.0f MiB is far above what -max-pending %d needs (%.0f MiB)", wafLimit, pending, wafNeed)
	}
}
