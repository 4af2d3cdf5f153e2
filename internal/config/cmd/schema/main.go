// Command schema writes the JSON Schema of the sidecar's configuration
// file, docs/config.schema.json, from the types of package config: their
// yaml keys, the shape of each value (durations, sizes, a route's agent
// as a name or a mapping) and their doc comments as descriptions, so that
// editors complete and check the keys of a sidecar.yaml:
//
//	go run ./internal/config/cmd/schema            # from the repository root
//	go run ./internal/config/cmd/schema -o -       # to stdout
//
// A test regenerates it and fails when the file is out of date. The
// schema helps an editor; the sidecar's own validation (check-config)
// stays the authority on values.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

func main() {
	out := flag.String("o", "docs/config.schema.json", "output `file` (- for stdout)")
	flag.Parse()
	b, err := generate(configDir())
	if err != nil {
		fmt.Fprintln(os.Stderr, "schema:", err)
		os.Exit(1)
	}
	if *out == "-" {
		_, _ = os.Stdout.Write(b)
		return
	}
	if err := os.WriteFile(*out, b, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "schema:", err)
		os.Exit(1)
	}
}

// configDir is the source directory of package config (../.. from here).
func configDir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Dir(filepath.Dir(filepath.Dir(file)))
}

// Values some string keys take (JSON Schema enums), by Go type and field.
// The constants keep them tied to package config.
var enums = map[string][]any{
	"Agent.Transport":        {config.TransportUDS, config.TransportGRPC, config.TransportReverse, config.TransportExtProc, config.TransportExtAuthz, config.TransportHTTPAuth},
	"Agent.FailureMode":      {config.FailClosed, config.FailOpen},
	"RouteAgent.FailureMode": {config.FailClosed, config.FailOpen},
	"Agent.PayloadEncoding":  {config.EncodingAuto, config.EncodingJSON},
	"BodyPolicy.Mode":        {config.BodyAuto, config.BodyNone, config.BodyBuffered, config.BodyStreaming},
	"BodyPolicy.OverLimit":   {config.OverLimitReject, config.OverLimitSkip, config.OverLimitPrefix, config.OverLimitStream},
	"Upstream.Balance":       {config.BalanceRoundRobin, config.BalanceLeastInFlight},
	"ListenerTLS.ClientAuth": {config.ClientAuthNone, config.ClientAuthOptional, config.ClientAuthRequire},
	// A bare 1.2 in YAML is a number; the sidecar reads it as "1.2".
	"ListenerTLS.MinVersion": {"1.2", "1.3", "TLS1.2", "TLS1.3", "tls1.2", "tls1.3", 1.2, 1.3},
	"UpstreamTLS.MinVersion": {"1.2", "1.3", "TLS1.2", "TLS1.3", "tls1.2", "tls1.3", 1.2, 1.3},
	"Logging.Level":          {"trace", "debug", "info", "warn", "error", "disabled"},
	"Logging.Format":         {"json", "console"},
}

// itemEnums are the values of the items of a list key.
var itemEnums = map[string][]string{
	"AccessLog.Fields": config.AccessLogFields,
}

// required are the keys a mapping must have (the rest have defaults).
var required = map[string][]string{
	"Config":         {"listeners", "routes"},
	"Listener":       {"address"},
	"Upstream":       {"name"},
	"Agent":          {"name", "transport", "address"},
	"Route":          {"upstream"},
	"RouteAgent":     {"name"},
	"TLSCertificate": {"cert_file", "key_file"},
}

var (
	durationType   = reflect.TypeFor[time.Duration]()
	sizeType       = reflect.TypeFor[config.Size]()
	routeAgentType = reflect.TypeFor[config.RouteAgent]()
)

// schemaGen builds the schema of the config types.
type schemaGen struct {
	docs map[string]string // "Type" and "Type.Field" → doc comment
	defs map[string]any
}

// generate returns the schema, its doc comments read from the sources
// of package config in dir.
func generate(dir string) ([]byte, error) {
	docs, err := readDocs(dir)
	if err != nil {
		return nil, err
	}
	g := &schemaGen{docs: docs, defs: map[string]any{}}
	root := g.object(reflect.TypeFor[config.Config]())
	root["$schema"] = "http://json-schema.org/draft-07/schema#"
	root["$id"] = "https://raw.githubusercontent.com/zentinelproxy/sidecar/main/docs/config.schema.json"
	root["title"] = "zentinel sidecar configuration"
	root["description"] = "The sidecar's YAML configuration (docs/configuration.md). Generated from package config by go run ./internal/config/cmd/schema; check-config is the authority on values."
	root["definitions"] = g.defs
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// object is the schema of a struct type: its yaml keys, no others.
func (g *schemaGen) object(t reflect.Type) map[string]any {
	props := map[string]any{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		key := t.Name() + "." + f.Name
		s := g.value(f.Type, key)
		if d := g.docs[key]; d != "" {
			// "Enabled writes …" reads "enabled writes …": the key, not
			// the Go name.
			if rest, ok := strings.CutPrefix(d, f.Name+" "); ok {
				d = name + " " + rest
			}
			s["description"] = d
		}
		props[name] = s
	}
	o := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if r := required[t.Name()]; len(r) > 0 {
		o["required"] = r
	}
	return o
}

// ref is a reference to the definition of struct type t, made once.
func (g *schemaGen) ref(t reflect.Type) map[string]any {
	if _, ok := g.defs[t.Name()]; !ok {
		g.defs[t.Name()] = nil // placeholder against recursion
		o := g.object(t)
		if d := g.docs[t.Name()]; d != "" {
			o["description"] = d
		}
		g.defs[t.Name()] = o
	}
	return map[string]any{"$ref": "#/definitions/" + t.Name()}
}

// value is the schema of a value of type t at key ("Type.Field").
func (g *schemaGen) value(t reflect.Type, key string) map[string]any {
	switch {
	case t == durationType:
		return map[string]any{"type": "string", "pattern": `^(0|([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+)$`,
			"examples": []string{"250ms", "5s", "1m30s"}}
	case t == sizeType:
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "integer", "minimum": 0},
			map[string]any{"type": "string", "pattern": `^\s*[0-9]+\s*(KiB|MiB|GiB|KB|MB|GB|B)?\s*$`},
		}, "examples": []string{"64KiB", "1MiB"}}
	case t == routeAgentType:
		// A route's agent is its name, or a mapping with overrides.
		return map[string]any{"anyOf": []any{map[string]any{"type": "string"}, g.ref(t)}}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return g.value(t.Elem(), key)
	case reflect.String:
		if e := enums[key]; e != nil {
			return map[string]any{"enum": e}
		}
		return map[string]any{"type": "string"}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Slice:
		items := g.value(t.Elem(), key)
		if e := itemEnums[key]; e != nil {
			items = map[string]any{"enum": e}
		}
		return map[string]any{"type": "array", "items": items}
	case reflect.Map:
		// Options are strings; YAML's bare true or 5s read as strings too.
		return map[string]any{"type": "object", "additionalProperties": map[string]any{"type": []string{"string", "number", "boolean"}}}
	case reflect.Struct:
		return g.ref(t)
	}
	panic(fmt.Sprintf("schema: no schema for %s (%s)", t, key))
}

// readDocs collects the doc comments of the types of package config and
// of their fields, one paragraph each.
func readDocs(dir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	fset := token.NewFileSet()
	docs := map[string]string{}
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, sp := range gd.Specs {
				ts := sp.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					continue
				}
				doc := ts.Doc
				if doc == nil && len(gd.Specs) == 1 {
					doc = gd.Doc
				}
				docs[ts.Name.Name] = paragraph(doc)
				for _, fld := range st.Fields.List {
					text := paragraph(fld.Doc)
					if text == "" {
						text = paragraph(fld.Comment)
					}
					for _, n := range fld.Names {
						docs[ts.Name.Name+"."+n.Name] = text
					}
				}
			}
		}
	}
	return docs, nil
}

// paragraph joins a comment's lines into one.
func paragraph(cg *ast.CommentGroup) string {
	if cg == nil {
		return ""
	}
	return strings.Join(strings.Fields(cg.Text()), " ")
}
