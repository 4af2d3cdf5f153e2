package deploy

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// TestKubernetesRunsCorazaWAF keeps the example's agent container the
// Coraza agent: an image the Dockerfile builds from
// examples/corazawaf/cmd/corazawaf, flags that command has, a socket the
// sidecar dials, and a body limit no smaller than the sidecar's, so that
// no body the sidecar sends is refused by the agent alone.
func TestKubernetesRunsCorazaWAF(t *testing.T) {
	all := manifests(t, "kubernetes")
	dep, cm := byKind(all, "Deployment")[0], byKind(all, "ConfigMap")[0]
	spec := object(dep.get("spec", "template", "spec").(map[string]any))
	var agent object
	for _, c := range spec.list("containers") {
		if c.str("name") != "sidecar" && mountPath(c, "sockets") != "" {
			agent = c
		}
	}
	if agent == nil {
		t.Fatal("no agent container sharing the sockets volume")
	}
	image := agent.str("image")
	target := strings.TrimPrefix(strings.SplitN(image, ":", 2)[0], "zentinelproxy/")
	if target != "corazawaf" {
		t.Fatalf("agent image %q, want zentinelproxy/corazawaf", image)
	}
	df, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "-o /out/corazawaf ./examples/corazawaf/cmd/corazawaf\n") ||
		!strings.Contains(string(df), " AS corazawaf\n") || !strings.Contains(string(df), `ENTRYPOINT ["/corazawaf"]`) {
		t.Error("the Dockerfile has no corazawaf target building ./examples/corazawaf/cmd/corazawaf")
	}

	// The flags the manifest passes exist in the command.
	src, err := os.ReadFile("../examples/corazawaf/cmd/corazawaf/main.go")
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range regexp.MustCompile(`fs\.\w+\((?:&[\w.]+, )?"([a-z-]+)"`).FindAllStringSubmatch(string(src), -1) {
		known[m[1]] = true
	}
	if !known["socket"] || !known["body-limit"] {
		t.Fatalf("flags not found in the command's source: %v", known)
	}
	args := map[string]string{}
	raw := agent.get("args").([]any)
	for i := 0; i < len(raw); i++ {
		name, _ := raw[i].(string)
		if !strings.HasPrefix(name, "-") {
			t.Fatalf("agent args: %q is not a flag", name)
		}
		name = strings.TrimLeft(name, "-")
		if !known[name] {
			t.Errorf("agent args: -%s is not a flag of corazawaf", name)
		}
		if i+1 < len(raw) {
			args[name], _ = raw[i+1].(string)
			i++
		}
	}

	c, err := config.Parse([]byte(cm.str("data", "sidecar.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	var waf *config.Agent
	for i := range c.Agents {
		if c.Agents[i].Transport == config.TransportUDS && c.Agents[i].Address == args["socket"] {
			waf = &c.Agents[i]
		}
	}
	if waf == nil {
		t.Fatalf("no uds agent of the sidecar at the agent's -socket %q", args["socket"])
	}
	if waf.RequestBody.Mode != config.BodyBuffered || waf.RequestBody.OverLimit == "skip" {
		t.Errorf("agent %s: request_body %+v: want buffered, over its limit rejected (a skipped body is not inspected)", waf.Name, waf.RequestBody)
	}
	bodyLimit := 1 << 20 // the command's default
	if v, ok := args["body-limit"]; ok {
		if bodyLimit, err = strconv.Atoi(v); err != nil {
			t.Fatalf("-body-limit %q: %v", v, err)
		}
	}
	if limit := int64(waf.RequestBody.Limit); limit == 0 || int64(bodyLimit) < limit {
		t.Errorf("agent -body-limit %d is below the sidecar's request_body limit %d", bodyLimit, limit)
	}
}
