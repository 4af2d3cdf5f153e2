package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// root is the repository root (internal/config/cmd/schema/../../../..).
func root() string { return filepath.Join(configDir(), "..", "..") }

// TestSchemaUpToDate: docs/config.schema.json is what the generator
// writes from the current types and comments.
func TestSchemaUpToDate(t *testing.T) {
	want, err := generate(configDir())
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root(), "docs", "config.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("docs/config.schema.json is out of date: run go run ./internal/config/cmd/schema")
	}
}

// loadSchema decodes the generated schema.
func loadSchema(t *testing.T) map[string]any {
	t.Helper()
	b, err := generate(configDir())
	if err != nil {
		t.Fatal(err)
	}
	var s map[string]any
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return s
}

// yamlDoc decodes YAML into the values JSON Schema is about.
func yamlDoc(t *testing.T, src string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(src), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestSchemaAcceptsConfigs: the configurations of the repository (the
// example, the demo's, the Kubernetes example's, the one in
// docs/configuration.md) and one with every form of value pass.
func TestSchemaAcceptsConfigs(t *testing.T) {
	s := loadSchema(t)
	docs := map[string]string{}
	for _, p := range []string{"testdata/config/example.yaml", "cmd/sidecar/demo.yaml"} {
		b, err := os.ReadFile(filepath.Join(root(), p))
		if err != nil {
			t.Fatal(err)
		}
		docs[p] = string(b)
	}
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	b, err := os.ReadFile(filepath.Join(root(), "deploy/kubernetes/configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &cm); err != nil {
		t.Fatal(err)
	}
	docs["configmap.yaml"] = cm.Data["sidecar.yaml"]
	md, err := os.ReadFile(filepath.Join(root(), "docs/configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)```yaml\n(listeners:.*?)```").FindSubmatch(md)
	if m == nil {
		t.Fatal("docs/configuration.md has no complete example")
	}
	docs["docs/configuration.md"] = string(m[1])
	docs["every form"] = `listeners:
  - address: 127.0.0.1:8080
    read_timeout: 1m30s
    read_buffer_size: 16384
    max_request_body: 10MiB
    tls:
      min_version: 1.3
      certificates: [{cert_file: a.pem, key_file: a.key, server_names: ["*.example.com"]}]
upstreams:
  - name: app
    endpoints: [10.0.0.1:80, 10.0.0.2:80]
    balance: least_in_flight
agents:
  - name: x
    transport: ext_proc
    address: 127.0.0.1:9100
    options: {tls: true, buffer_limit: 65536, processing_mode: "request_body_mode=BUFFERED"}
    request_body: {mode: buffered, limit: 1MiB, over_limit: prefix}
    failover: false
routes:
  - upstream: app
    agents:
      - x
      - {name: x, failure_mode: open, timeout: 2s, request_body: {limit: 64KiB}}
tracing: {otlp: {endpoint: "collector:4317", sample_ratio: 0.25}}
access_log: {enabled: true, fields: [time, route, status]}
`
	for name, d := range docs {
		if errs := validate(s, s, yamlDoc(t, d), ""); len(errs) > 0 {
			t.Errorf("%s: %s", name, strings.Join(errs, "; "))
		}
	}
}

// TestSchemaRefuses: a misspelled key, a wrong shape or value is an error
// at its path, as an editor would show it.
func TestSchemaRefuses(t *testing.T) {
	s := loadSchema(t)
	for _, c := range []struct{ doc, want string }{
		{"listeners: [{adress: x}]\nroutes: []\n", "listeners[0].adress: unknown key"},
		{"listeners: [{address: x}]\nroutes: [{upstream: a, agents: [{name: w, failure_mode: maybe}]}]\n", "routes[0].agents[0]: no alternative"},
		{"listeners: [{address: x, read_timeout: 5}]\nroutes: []\n", "listeners[0].read_timeout: want string"},
		{"listeners: [{address: x, max_request_body: 1 MB}]\nroutes: []\n", ""},
		{"listeners: [{address: x, max_request_body: lots}]\nroutes: []\n", "listeners[0].max_request_body: no alternative"},
		{"routes: []\n", ": missing key listeners"},
		{"listeners: [{address: x}]\nroutes: []\naccess_log: {fields: [protocl]}\n", `access_log.fields[0]: "protocl" is not one of`},
	} {
		errs := validate(s, s, yamlDoc(t, c.doc), "")
		switch {
		case c.want == "" && len(errs) > 0:
			t.Errorf("%q: refused: %v", c.doc, errs)
		case c.want != "" && !slices.ContainsFunc(errs, func(e string) bool { return strings.HasPrefix(e, c.want) }):
			t.Errorf("%q: errors %v, want %q", c.doc, errs, c.want)
		}
	}
}

// validate checks v against the subset of JSON Schema the generator
// writes: $ref, type, properties, additionalProperties, required, items,
// enum, anyOf, pattern, minimum.
func validate(root, s map[string]any, v any, path string) []string {
	if ref, ok := s["$ref"].(string); ok {
		def := root["definitions"].(map[string]any)[strings.TrimPrefix(ref, "#/definitions/")]
		return validate(root, def.(map[string]any), v, path)
	}
	if alts, ok := s["anyOf"].([]any); ok {
		for _, a := range alts {
			if len(validate(root, a.(map[string]any), v, path)) == 0 {
				return nil
			}
		}
		return []string{path + ": no alternative of anyOf matches"}
	}
	if e, ok := s["enum"].([]any); ok {
		for _, x := range e {
			if fmt.Sprint(x) == fmt.Sprint(v) && sameKind(x, v) {
				return nil
			}
		}
		return []string{fmt.Sprintf("%s: %q is not one of %v", path, fmt.Sprint(v), e)}
	}
	if typ, ok := s["type"]; ok && !hasType(typ, v) {
		return []string{fmt.Sprintf("%s: want %v, got %T", path, typ, v)}
	}
	var errs []string
	switch x := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for k, val := range x {
			p := strings.TrimPrefix(path+"."+k, ".")
			if ps, ok := props[k]; ok {
				errs = append(errs, validate(root, ps.(map[string]any), val, p)...)
				continue
			}
			switch ap := s["additionalProperties"].(type) {
			case bool:
				if !ap {
					errs = append(errs, p+": unknown key")
				}
			case map[string]any:
				errs = append(errs, validate(root, ap, val, p)...)
			}
		}
		if req, ok := s["required"].([]any); ok {
			for _, r := range req {
				if _, ok := x[r.(string)]; !ok {
					errs = append(errs, fmt.Sprintf("%s: missing key %s", path, r))
				}
			}
		}
	case []any:
		if items, ok := s["items"].(map[string]any); ok {
			for i, e := range x {
				errs = append(errs, validate(root, items, e, fmt.Sprintf("%s[%d]", path, i))...)
			}
		}
	case string:
		if p, ok := s["pattern"].(string); ok && !regexp.MustCompile(p).MatchString(x) {
			errs = append(errs, fmt.Sprintf("%s: %q does not match %s", path, x, p))
		}
	case int:
		if m, ok := s["minimum"].(float64); ok && float64(x) < m {
			errs = append(errs, fmt.Sprintf("%s: %d below %v", path, x, m))
		}
	}
	return errs
}

func sameKind(a, b any) bool {
	_, as := a.(string)
	_, bs := b.(string)
	return as == bs
}

// hasType reports whether v is of the JSON type (or one of the types).
func hasType(typ any, v any) bool {
	if l, ok := typ.([]any); ok {
		for _, t := range l {
			if hasType(t, v) {
				return true
			}
		}
		return false
	}
	switch typ {
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	case "string":
		_, ok := v.(string)
		return ok
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "integer":
		switch n := v.(type) {
		case int:
			return true
		case float64:
			return n == math.Trunc(n)
		}
	case "number":
		switch v.(type) {
		case int, float64:
			return true
		}
	}
	return false
}
