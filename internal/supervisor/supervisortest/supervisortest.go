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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// LongWait bounds every wait so that a broken build fails instead of
// hanging; never a performance assertion.
const LongWait = 20 * time.Second

// NoRedirects is an HTTP client that returns redirects as they are.
var NoRedirects = &http.Client{
	Timeout: LongWait,
	CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	},
}

// Dir is a short private directory for sockets (107-byte limit), removed
// when the test ends.
func Dir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ops")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
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

// ServeAgent serves h on the Unix socket path until the returned stop
// runs (or the test ends).
func ServeAgent(t testing.TB, path string, h sdk.Handler) (stop func()) {
	t.Helper()
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = sdk.Serve(ctx, ln, h, nil)
	}()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
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

// WaitFor polls cond until it holds (bounded by LongWait).
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(LongWait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
