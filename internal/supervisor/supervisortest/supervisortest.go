// Package supervisortest holds the helpers the tests of the supervisor
// and of the sidecar binary share: a test upstream, a policy agent on a
// Unix socket, configuration files, metrics scrapes and polling.
package supervisortest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// LongWait bounds every wait (see testutil.LongWait).
const LongWait = testutil.LongWait

// NoRedirects is an HTTP client that returns redirects as they are.
var NoRedirects = &http.Client{
	Timeout: LongWait,
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

// Upstream answers every request with 200, its name in the body and in
// X-Upstream, and the request target in X-Target; /slow/ waits ?ms=
// milliseconds first. InFlight counts the requests it is handling.
type Upstream struct {
	Name     string
	Addr     string
	InFlight atomic.Int64
	srv      *http.Server
}

// StartUpstream serves an Upstream on a free loopback port until the test
// ends.
func StartUpstream(t testing.TB, name string) *Upstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &Upstream{Name: name, Addr: ln.Addr().String()}
	u.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.InFlight.Add(1)
		defer u.InFlight.Add(-1)
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.Contains(r.URL.Path, "/slow/") {
			var ms int
			_, _ = fmt.Sscan(r.URL.Query().Get("ms"), &ms)
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		w.Header().Set("X-Upstream", u.Name)
		w.Header().Set("X-Target", r.RequestURI)
		_, _ = io.WriteString(w, u.Name+"\n")
	})}
	go func() { _ = u.srv.Serve(ln) }()
	t.Cleanup(func() { _ = u.srv.Close() })
	return u
}

// PolicyAgent blocks /block paths, redirects /redir paths and allows the
// rest, tagging allowed requests with x-policy. Seen counts the requests
// it saw.
type PolicyAgent struct {
	sdk.Base
	Seen atomic.Int64
}

// NewPolicyAgent returns a PolicyAgent that handles request headers and
// bodies.
func NewPolicyAgent() *PolicyAgent {
	return &PolicyAgent{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true, HandlesRequestBody: true}}}
}

// OnRequestHeaders decides by path.
func (a *PolicyAgent) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	a.Seen.Add(1)
	switch {
	case bytes.Contains(m.URI, []byte("/block")):
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("blocked\n")
	case bytes.Contains(m.URI, []byte("/redir")):
		d.Kind, d.Status, d.RedirectURL = protocol.DecisionRedirect, 302, []byte("/elsewhere")
	default:
		d.RequestHeaderOps = append(d.RequestHeaderOps, protocol.HeaderOp{Op: protocol.HeaderSet, Name: []byte("x-policy"), Value: []byte("ok")})
	}
	return nil
}

// WriteConfig replaces the file at path with content atomically.
func WriteConfig(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Scrape reads base/metrics into `name{a="x",b="y"}` → value (labels
// sorted by name, as the exposition writes them; histograms as their
// _count).
func Scrape(t testing.TB, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for name, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var parts []string
			for _, l := range m.GetLabel() {
				parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(parts)
			key := name
			if len(parts) > 0 {
				key += "{" + strings.Join(parts, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[strings.Replace(key, name, name+"_count", 1)] = float64(m.GetHistogram().GetSampleCount())
			case m.Untyped != nil:
				out[key] = m.GetUntyped().GetValue()
			}
		}
	}
	return out
}

// GetJSON GETs url and decodes its JSON object.
func GetJSON(t testing.TB, url string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}
