package admin

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/zentinelproxy/sidecar/dataplane"
	"github.com/zentinelproxy/sidecar/internal/metrics"
)

// TestMetricsOpenMetrics: /metrics answers OpenMetrics to every Accept
// that asks for it (Prometheus's default header included) with a body
// that is OpenMetrics, and the text format 0.0.4 to everything else.
func TestMetricsOpenMetrics(t *testing.T) {
	m, err := metrics.New(metrics.Config{Version: "v9"})
	if err != nil {
		t.Fatal(err)
	}
	m.Reset([]string{"api"}, []string{"waf"})
	m.RecordRequest(&dataplane.RequestSummary{Route: 0, Outcome: dataplane.RequestBlocked, Agent: 0, Status: 403})
	_, base := start(t, Config{Gatherer: m.Registry()})

	const (
		om1  = "application/openmetrics-text; version=1.0.0; charset=utf-8"
		om01 = "application/openmetrics-text; version=0.0.1; charset=utf-8"
		text = "text/plain; version=0.0.4; charset=utf-8"
	)
	for _, c := range []struct{ accept, want string }{
		// Prometheus's default scrape header.
		{"application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1", om1},
		{"application/openmetrics-text; version=1.0.0", om1},
		{"application/openmetrics-text;version=1.0.0;charset=utf-8", om1},
		{"application/openmetrics-text;version=0.0.1", om01},
		{"application/openmetrics-text", om01},
		{"text/plain;version=0.0.4;q=0.3,application/openmetrics-text;version=1.0.0;q=0.9", om1},
		{"", text},
		{"*/*", text},
		{"text/plain", text},
		{"text/plain;version=0.0.4", text},
	} {
		req, _ := http.NewRequest("GET", base+"/metrics", nil)
		if c.accept != "" {
			req.Header.Set("Accept", c.accept)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		ct := resp.Header.Get("Content-Type")
		// The escaping parameter the library appends is not the format.
		got, _, _ := strings.Cut(ct, "; escaping=")
		if resp.StatusCode != 200 || got != c.want {
			t.Errorf("Accept %q: %d %q, want %q", c.accept, resp.StatusCode, ct, c.want)
			continue
		}
		if strings.HasPrefix(c.want, "application/openmetrics-text") {
			fams, err := parseOpenMetrics(string(body))
			if err != nil {
				t.Errorf("Accept %q: the body is not OpenMetrics: %v", c.accept, err)
				continue
			}
			for name, typ := range map[string]string{
				"sidecar_requests": "counter", "sidecar_request_duration_seconds": "histogram",
				"sidecar_build_info": "gauge", "go_goroutines": "gauge",
			} {
				if fams[name] != typ {
					t.Errorf("Accept %q: family %s is %q, want %s", c.accept, name, fams[name], typ)
				}
			}
			if !strings.Contains(string(body), `sidecar_requests_total{outcome="blocked",route="api"} 1`) {
				t.Errorf("Accept %q: the blocked request is not counted:\n%.2000s", c.accept, body)
			}
			continue
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		if _, err := p.TextToMetricFamilies(strings.NewReader(string(body))); err != nil {
			t.Errorf("Accept %q: the text body does not parse: %v", c.accept, err)
		}
		if strings.Contains(string(body), "# EOF") {
			t.Errorf("Accept %q: a text body ends in # EOF", c.accept)
		}
	}
}

var (
	omSample = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)( \S+)?( # .*)?$`)
	omLabel  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\]|\\.)*"$`)
	omTypes  = map[string][]string{
		"counter":        {"_total", "_created"},
		"gauge":          {""},
		"histogram":      {"_bucket", "_count", "_sum", "_created"},
		"gaugehistogram": {"_bucket", "_gcount", "_gsum"},
		"summary":        {"", "_count", "_sum", "_created"},
		"info":           {"_info"},
		"stateset":       {""},
		"unknown":        {""},
	}
)

// parseOpenMetrics checks s against the OpenMetrics 1.0 text format (the
// structure expfmt cannot parse): metadata before the samples of its
// family, each family once, sample names that its type allows, float
// values, histogram buckets with an le label, and a final "# EOF" with
// nothing after it. It returns each family's type.
func parseOpenMetrics(s string) (map[string]string, error) {
	if !strings.HasSuffix(s, "\n# EOF\n") {
		return nil, fmt.Errorf("does not end with a # EOF line")
	}
	fams := map[string]string{}
	cur := ""
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	n, eof, sampled := 0, false, false
	for sc.Scan() {
		n++
		line := sc.Text()
		if eof {
			return nil, fmt.Errorf("line %d after # EOF", n)
		}
		if line == "# EOF" {
			eof = true
			continue
		}
		if strings.HasPrefix(line, "# ") {
			f := strings.SplitN(line, " ", 4)
			if len(f) < 3 {
				return nil, fmt.Errorf("line %d: bad metadata %q", n, line)
			}
			switch f[1] {
			case "TYPE", "HELP", "UNIT":
			default:
				return nil, fmt.Errorf("line %d: unknown metadata %q", n, line)
			}
			// A family's metadata comes together, before its samples.
			if f[2] != cur {
				if _, dup := fams[f[2]]; dup {
					return nil, fmt.Errorf("line %d: family %s appears twice", n, f[2])
				}
				fams[f[2]], cur = "unknown", f[2]
				sampled = false
			}
			if sampled {
				return nil, fmt.Errorf("line %d: metadata after the samples of %s", n, cur)
			}
			if f[1] == "TYPE" {
				if len(f) != 4 || omTypes[f[3]] == nil {
					return nil, fmt.Errorf("line %d: bad TYPE %q", n, line)
				}
				fams[cur] = f[3]
			}
			continue
		}
		m := omSample.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("line %d: not a sample: %q", n, line)
		}
		name, labels, value := m[1], m[2], m[3]
		sampled = true
		suffix, ok := strings.CutPrefix(name, cur)
		if cur == "" || !ok {
			return nil, fmt.Errorf("line %d: sample %s outside its family (current %s)", n, name, cur)
		}
		typ := fams[cur]
		valid := false
		for _, s := range omTypes[typ] {
			valid = valid || s == suffix
		}
		if !valid {
			return nil, fmt.Errorf("line %d: sample %s in %s family %s", n, name, typ, cur)
		}
		if _, err := strconv.ParseFloat(value, 64); err != nil {
			return nil, fmt.Errorf("line %d: value %q: %v", n, value, err)
		}
		hasLE := false
		if labels != "" {
			for _, l := range splitLabels(strings.TrimSuffix(strings.TrimPrefix(labels, "{"), "}")) {
				if !omLabel.MatchString(l) {
					return nil, fmt.Errorf("line %d: bad label %q", n, l)
				}
				hasLE = hasLE || strings.HasPrefix(l, `le="`)
			}
		}
		if suffix == "_bucket" && !hasLE {
			return nil, fmt.Errorf("line %d: bucket without le", n)
		}
	}
	if !eof {
		return nil, fmt.Errorf("no # EOF")
	}
	return fams, nil
}

// splitLabels splits a{x="1",y="a,b"}'s inside at the commas between
// labels.
func splitLabels(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && quoted:
			i++
		case s[i] == '"':
			quoted = !quoted
		case s[i] == ',' && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}
