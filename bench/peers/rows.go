package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// rowDef is one row of the table: a way to put a proxy (and maybe an
// agent) between wrk and the upstream.
type rowDef struct {
	key   string   // short name for -rows
	name  string   // as printed
	tools []string // installed programs it needs (besides wrk and taskset)
	bins  []string // programs of this module (or the sidecar) it needs
	agent bool     // it does the job (agent or auth server), so it is checked
	h2    bool     // the client side is HTTP/2 (h2c, prior knowledge), loaded by h2load
	// grpc: gRPC unary calls end to end (h2c both sides), loaded by
	// cmd/grpcload, to cmd/grpcupstream (h2 is set too).
	grpc  bool
	setup func(h *harness, rc *rowCtx) error
}

// rowCtx is a row being run: its directory, addresses and processes.
type rowCtx struct {
	dir      string
	upstream string // host:port of the upstream
	target   string // base URL the load goes to
	h2       bool   // the proxy listens for h2c (prior knowledge), not HTTP/1
	grpc     bool   // gRPC rows: the upstream is cmd/grpcupstream (h2c)
	stats    string // host:port of the upstream's stats ("": upstream)
	up       *proc
	proxy    *proc
	agent    *proc
	// proxyPIDs are the processes whose CPU counts as the proxy's (nginx:
	// master and workers); the agent's is agent's alone.
	proxyPIDs []int
}

// rows lists every row in table order. HAProxy + SPOE is the reference
// for the ratios.
var rows = []rowDef{
	{key: "direct", name: "upstream direct", setup: setupDirect},
	{key: "haproxy", name: "HAProxy, no agent", tools: []string{"haproxy"}, setup: setupHAProxy(false)},
	{key: "haproxy-spoe", name: "HAProxy + SPOE agent", tools: []string{"haproxy"}, bins: []string{"spoeagent"}, agent: true, setup: setupHAProxy(true)},
	{key: "nginx", name: "nginx, no agent", tools: []string{"nginx"}, setup: setupNginx(false)},
	{key: "nginx-auth", name: "nginx + auth_request", tools: []string{"nginx"}, bins: []string{"authserver"}, agent: true, setup: setupNginx(true)},
	{key: "nginx-auth-tcp", name: "nginx + auth_request, auth server over TCP", tools: []string{"nginx"}, bins: []string{"authserver"}, agent: true, setup: setupNginxTCP},
	{key: "caddy", name: "Caddy, no agent", tools: []string{"caddy"}, setup: setupCaddy(false)},
	{key: "caddy-auth", name: "Caddy + forward_auth", tools: []string{"caddy"}, bins: []string{"authserver"}, agent: true, setup: setupCaddy(true)},
	{key: "fasthttp", name: "fasthttp HostClient proxy, no agent", bins: []string{"fhproxy"}, setup: setupFasthttp},
	{key: "loop", name: "epoll-loop floor, no agent", bins: []string{"loopproxy"}, setup: setupLoop(false)},
	{key: "loop-uds", name: "epoll-loop floor + UDS agent (Go SDK)", bins: []string{"loopproxy", "sdkagent"}, agent: true, setup: setupLoop(true)},
	{key: "loop-uds-yield", name: "epoll-loop floor + UDS agent under SCHED_BATCH", bins: []string{"loopproxy", "sdkagent"}, agent: true, setup: setupLoop(true, "-sched", "batch")},
	{key: "sidecar", name: "sidecar, no agent", bins: []string{"sidecar"}, setup: setupSidecar("sidecar", "", false)},
	{key: "sidecar-uds", name: "sidecar + UDS agent (Go SDK)", bins: []string{"sidecar", "sdkagent"}, agent: true, setup: setupSidecar("sidecar", "sdkagent", false)},
	{key: "sidecar-uds-json", name: "sidecar + UDS agent, JSON payloads", bins: []string{"sidecar", "sdkagent"}, agent: true, setup: setupSidecar("sidecar", "sdkagent", true)},
	{key: "sidecar-uds-yield", name: "sidecar + UDS agent, agent under SCHED_BATCH", bins: []string{"sidecar", "sdkagent"}, agent: true, setup: setupSidecar("sidecar", "sdkagent", false, "-sched", "batch")},
	{key: "sidecar-httpauth", name: "sidecar + http_auth (forward auth)", bins: []string{"sidecar", "authserver"}, agent: true, setup: setupSidecarHTTPAuth("sidecar", "authserver", true)},
	{key: "sidecar-httpauth-pipe", name: "sidecar + http_auth, subrequests pipelined (pipeline: 16)", bins: []string{"sidecar", "authserver"}, agent: true, setup: setupSidecarHTTPAuthPipe("sidecar", "authserver", 16)},
	{key: "sidecar-httpauth-tcp", name: "sidecar + http_auth, auth server over TCP", bins: []string{"sidecar", "authserver"}, agent: true, setup: setupSidecarHTTPAuth("sidecar", "authserver", false)},

	// HTTP/2 from the client (h2c with prior knowledge, loaded by h2load),
	// HTTP/1.1 to the upstream as above. Their ratios are to
	// haproxy-spoe-h2.
	{key: "haproxy-h2", name: "HTTP/2: HAProxy, no agent", tools: []string{"haproxy", "h2load"}, h2: true, setup: setupHAProxy(false)},
	{key: "haproxy-spoe-h2", name: "HTTP/2: HAProxy + SPOE agent", tools: []string{"haproxy", "h2load"}, bins: []string{"spoeagent"}, agent: true, h2: true, setup: setupHAProxy(true)},
	{key: "nginx-h2", name: "HTTP/2: nginx, no agent", tools: []string{"nginx", "h2load"}, h2: true, setup: setupNginx(false)},
	{key: "nginx-auth-h2", name: "HTTP/2: nginx + auth_request", tools: []string{"nginx", "h2load"}, bins: []string{"authserver"}, agent: true, h2: true, setup: setupNginx(true)},
	{key: "sidecar-h2", name: "HTTP/2: sidecar, no agent", tools: []string{"h2load"}, bins: []string{"sidecar"}, h2: true, setup: setupSidecar("sidecar", "", false)},
	{key: "sidecar-uds-h2", name: "HTTP/2: sidecar + UDS agent (Go SDK)", tools: []string{"h2load"}, bins: []string{"sidecar", "sdkagent"}, agent: true, h2: true, setup: setupSidecar("sidecar", "sdkagent", false)},

	// gRPC unary calls (cmd/grpcload: -connections ClientConns, -h2-streams
	// calls in flight on each), h2c to the proxy and from it to a grpc-go
	// upstream (cmd/grpcupstream). Their ratios are to grpc-haproxy-spoe.
	{key: "grpc-direct", name: "gRPC: upstream direct", bins: grpcBins, h2: true, grpc: true, setup: setupDirect},
	{key: "grpc-haproxy", name: "gRPC: HAProxy, no agent", tools: []string{"haproxy"}, bins: grpcBins, h2: true, grpc: true, setup: setupHAProxy(false)},
	{key: "grpc-haproxy-spoe", name: "gRPC: HAProxy + SPOE agent", tools: []string{"haproxy"}, bins: append([]string{"spoeagent"}, grpcBins...), agent: true, h2: true, grpc: true, setup: setupHAProxy(true)},
	{key: "grpc-sidecar", name: "gRPC: sidecar, no agent", bins: append([]string{"sidecar"}, grpcBins...), h2: true, grpc: true, setup: setupSidecar("sidecar", "", false)},
	{key: "grpc-sidecar-uds", name: "gRPC: sidecar + UDS agent (Go SDK)", bins: append([]string{"sidecar", "sdkagent"}, grpcBins...), agent: true, h2: true, grpc: true, setup: setupSidecar("sidecar", "sdkagent", false)},
}

// grpcBins are the programs every gRPC row needs.
var grpcBins = []string{"grpcupstream", "grpcload"}

// baselineRows are the sidecar rows again, built from another checkout
// (-baseline): the same rows of two builds, measured in the same rounds.
var baselineRows = []rowDef{
	{key: "sidecar-base", name: "sidecar, no agent (baseline)", bins: []string{"sidecar-base"}, setup: setupSidecar("sidecar-base", "", false)},
	{key: "sidecar-uds-base", name: "sidecar + UDS agent (baseline)", bins: []string{"sidecar-base", "sdkagent-base"}, agent: true, setup: setupSidecar("sidecar-base", "sdkagent-base", false)},
	{key: "sidecar-httpauth-base", name: "sidecar + http_auth (baseline)", bins: []string{"sidecar-base", "authserver-base"}, agent: true, setup: setupSidecarHTTPAuth("sidecar-base", "authserver-base", true)},
	{key: "sidecar-httpauth-tcp-base", name: "sidecar + http_auth over TCP (baseline)", bins: []string{"sidecar-base", "authserver-base"}, agent: true, setup: setupSidecarHTTPAuth("sidecar-base", "authserver-base", false)},
	{key: "sidecar-h2-base", name: "HTTP/2: sidecar, no agent (baseline)", tools: []string{"h2load"}, bins: []string{"sidecar-base"}, h2: true, setup: setupSidecar("sidecar-base", "", false)},
	{key: "sidecar-uds-h2-base", name: "HTTP/2: sidecar + UDS agent (baseline)", tools: []string{"h2load"}, bins: []string{"sidecar-base", "sdkagent-base"}, agent: true, h2: true, setup: setupSidecar("sidecar-base", "sdkagent-base", false)},
	{key: "grpc-sidecar-base", name: "gRPC: sidecar, no agent (baseline)", bins: append([]string{"sidecar-base"}, grpcBins...), h2: true, grpc: true, setup: setupSidecar("sidecar-base", "", false)},
	{key: "grpc-sidecar-uds-base", name: "gRPC: sidecar + UDS agent (baseline)", bins: append([]string{"sidecar-base", "sdkagent-base"}, grpcBins...), agent: true, h2: true, grpc: true, setup: setupSidecar("sidecar-base", "sdkagent-base", false)},
}

// reference is the row the ratios divide by; referenceH2 that of the
// HTTP/2 rows.
const (
	reference     = "haproxy-spoe"
	referenceH2   = "haproxy-spoe-h2"
	referenceGRPC = "grpc-haproxy-spoe"
)

// referenceOf is the row whose ratios d's are: HAProxy + SPOE on the same
// client protocol.
func referenceOf(d rowDef) string {
	if d.grpc {
		return referenceGRPC
	}
	if d.h2 {
		return referenceH2
	}
	return reference
}

// goEnv is the environment of every Go program the harness starts: its
// GOMAXPROCS (one core's worth by default), or none for the runtime's
// default.
func (h *harness) goEnv() []string {
	if h.gomaxprocs == 0 {
		return nil
	}
	return []string{"GOMAXPROCS=" + strconv.Itoa(h.gomaxprocs)}
}

const startTimeout = 10 * time.Second

func setupDirect(h *harness, rc *rowCtx) error {
	rc.target = "http://" + rc.upstream
	return nil
}

// writeTemplate renders text with data into dir/name and returns its path.
func writeTemplate(dir, name, text string, data any) (string, error) {
	t, err := template.New(name).Parse(text)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	if err := t.Execute(&b, data); err != nil {
		return "", err
	}
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(b.String()), 0o644)
}

// startAgent starts a harness-built agent (or auth server) on the proxy's
// CPUs and waits for its Unix socket.
func startAgent(h *harness, rc *rowCtx, bin, sock string, args ...string) error {
	p, err := h.startSUT(bin, filepath.Join(rc.dir, bin+".log"), h.goEnv(),
		append([]string{h.bin(bin)}, args...)...)
	if err != nil {
		return err
	}
	rc.agent = p
	return waitDial(p, "unix", sock, startTimeout)
}

const haproxyCfg = `global
    nbthread 1
    maxconn 4096
    # no logging: the other proxies log nothing per request either

defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
    timeout http-keep-alive 30s

frontend fe
    bind {{.Listen}}{{if .H2}} proto h2{{end}}
{{- if .Agent}}
    filter spoe engine peers config {{.SPOEConf}}
    http-request deny deny_status 503 if { var(txn.agent.error) -m found }
    http-request deny deny_status 403 if { var(txn.agent.block) -m bool }
    http-request set-header X-Agent-Processed %[var(txn.agent.processed)] if { var(txn.agent.processed) -m found }
{{- end}}
    default_backend app

backend app
    server app {{.Upstream}} maxconn 1024{{if .GRPC}} proto h2{{end}}
{{- if .Agent}}

backend spoe-agents
    mode tcp
    timeout connect 5s
    timeout server 30s
    server agent unix@{{.AgentSock}}
{{- end}}
`

const spoeCfg = `[peers]
spoe-agent peers-agent
    messages peers-check
    option var-prefix agent
    option set-on-error error
    timeout hello 2s
    timeout idle 30s
    timeout processing 1s
    use-backend spoe-agents

spoe-message peers-check
    args path=path
    event on-frontend-http-request
`

func setupHAProxy(agent bool) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error {
		addrs, err := freeAddrs(1)
		if err != nil {
			return err
		}
		data := map[string]any{
			"Listen": addrs[0], "Upstream": rc.upstream, "Agent": agent, "H2": rc.h2, "GRPC": rc.grpc,
			"AgentSock": filepath.Join(rc.dir, "spoe.sock"),
			"SPOEConf":  filepath.Join(rc.dir, "spoe.conf"),
		}
		if agent {
			if _, err := writeTemplate(rc.dir, "spoe.conf", spoeCfg, data); err != nil {
				return err
			}
			if err := startAgent(h, rc, "spoeagent", data["AgentSock"].(string), "-listen", "unix:"+data["AgentSock"].(string)); err != nil {
				return err
			}
		}
		cfg, err := writeTemplate(rc.dir, "haproxy.cfg", haproxyCfg, data)
		if err != nil {
			return err
		}
		p, err := h.startSUT("haproxy", filepath.Join(rc.dir, "haproxy.log"), nil,
			h.tools["haproxy"], "-db", "-f", cfg)
		if err != nil {
			return err
		}
		rc.proxy, rc.target = p, "http://"+addrs[0]
		return waitDial(p, "tcp", addrs[0], startTimeout)
	}
}

const nginxCfg = `worker_processes 1;
{{- if .Root}}
user root;
{{- end}}
daemon off;
pid {{.Dir}}/nginx.pid;
error_log {{.Dir}}/nginx-error.log warn;

events {
    worker_connections 4096;
}

http {
    access_log off;
    client_body_temp_path {{.Dir}}/client_body;
    proxy_temp_path {{.Dir}}/proxy_temp;
    fastcgi_temp_path {{.Dir}}/fastcgi_temp;
    uwsgi_temp_path {{.Dir}}/uwsgi_temp;
    scgi_temp_path {{.Dir}}/scgi_temp;
    # nginx closes a keep-alive connection after 1000 requests by default;
    # the other proxies do not.
    keepalive_requests 1000000;

    upstream app {
        server {{.Upstream}};
        keepalive 128;
        keepalive_requests 1000000;
    }
{{- if .Agent}}

    upstream auth {
        server {{.AuthServer}};
        keepalive 128;
        keepalive_requests 1000000;
    }
{{- end}}

    server {
        # http2 without ssl: h2c with prior knowledge only.
        listen {{.Listen}}{{if .H2}} http2{{end}};

        location / {
{{- if .Agent}}
            auth_request /_auth;
            auth_request_set $agent_processed $upstream_http_x_agent_processed;
            proxy_set_header X-Agent-Processed $agent_processed;
{{- end}}
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_pass http://app;
        }
{{- if .Agent}}

        location = /_auth {
            internal;
            proxy_pass http://auth;
            proxy_pass_request_body off;
            proxy_set_header Content-Length "";
            proxy_set_header X-Original-URI $request_uri;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }
{{- end}}
    }
}
`

func setupNginx(agent bool) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error { return nginxRow(h, rc, agent, false) }
}

// setupNginxTCP is the nginx-auth row with the auth server on a loopback
// port, as the sidecar's http_auth row asks it (an http:// URL).
func setupNginxTCP(h *harness, rc *rowCtx) error { return nginxRow(h, rc, true, true) }

func nginxRow(h *harness, rc *rowCtx, agent, tcp bool) error {
	addrs, err := freeAddrs(2)
	if err != nil {
		return err
	}
	sock := filepath.Join(rc.dir, "auth.sock")
	data := map[string]any{
		"Listen": addrs[0], "Upstream": rc.upstream, "Agent": agent, "Dir": rc.dir, "H2": rc.h2,
		"Root": os.Geteuid() == 0, "AuthServer": "unix:" + sock,
	}
	switch {
	case agent && tcp:
		p, err := h.startSUT("authserver", filepath.Join(rc.dir, "authserver.log"), h.goEnv(),
			h.bin("authserver"), "-listen", addrs[1])
		if err != nil {
			return err
		}
		rc.agent = p
		if err := waitDial(p, "tcp", addrs[1], startTimeout); err != nil {
			return err
		}
		data["AuthServer"] = addrs[1]
	case agent:
		if err := startAgent(h, rc, "authserver", sock, "-listen", "unix:"+sock); err != nil {
			return err
		}
	}
	cfg, err := writeTemplate(rc.dir, "nginx.conf", nginxCfg, data)
	if err != nil {
		return err
	}
	p, err := h.startSUT("nginx", filepath.Join(rc.dir, "nginx.log"), nil,
		h.tools["nginx"], "-c", cfg, "-p", rc.dir+"/", "-e", filepath.Join(rc.dir, "nginx-error.log"))
	if err != nil {
		return err
	}
	rc.proxy, rc.target = p, "http://"+addrs[0]
	if err := waitDial(p, "tcp", addrs[0], startTimeout); err != nil {
		return fmt.Errorf("%w\nnginx-error.log: %s", err, readTail(filepath.Join(rc.dir, "nginx-error.log")))
	}
	// The worker forks after the listener opens: wait for it.
	deadline := time.Now().Add(startTimeout)
	for len(children(p.Pid())) == 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("nginx: no worker process after %v", startTimeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	rc.proxyPIDs = append([]int{p.Pid()}, children(p.Pid())...)
	return nil
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 1500 {
		b = b[len(b)-1500:]
	}
	return strings.TrimSpace(string(b))
}

const caddyCfg = `{
	admin off
	auto_https off
}

http://:{{.Port}} {
	bind 127.0.0.1
{{- if .Agent}}
	forward_auth unix/{{.AuthSock}} {
		uri /auth
		copy_headers X-Agent-Processed
		transport http {
			keepalive_idle_conns 128
			keepalive_idle_conns_per_host 128
		}
	}
{{- end}}
	reverse_proxy {{.Upstream}} {
		transport http {
			keepalive_idle_conns 128
			keepalive_idle_conns_per_host 128
		}
	}
}
`

func setupCaddy(agent bool) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error {
		addrs, err := freeAddrs(1)
		if err != nil {
			return err
		}
		port := addrs[0][strings.LastIndexByte(addrs[0], ':')+1:]
		data := map[string]any{
			"Port": port, "Upstream": rc.upstream, "Agent": agent,
			"AuthSock": filepath.Join(rc.dir, "auth.sock"),
		}
		if agent {
			if err := startAgent(h, rc, "authserver", data["AuthSock"].(string), "-listen", "unix:"+data["AuthSock"].(string)); err != nil {
				return err
			}
		}
		cfg, err := writeTemplate(rc.dir, "Caddyfile", caddyCfg, data)
		if err != nil {
			return err
		}
		env := append([]string{
			"XDG_CONFIG_HOME=" + filepath.Join(rc.dir, "caddy-config"),
			"XDG_DATA_HOME=" + filepath.Join(rc.dir, "caddy-data"),
		}, h.goEnv()...)
		p, err := h.startSUT("caddy", filepath.Join(rc.dir, "caddy.log"), env,
			h.tools["caddy"], "run", "--config", cfg, "--adapter", "caddyfile")
		if err != nil {
			return err
		}
		rc.proxy, rc.target = p, "http://"+addrs[0]
		return waitDial(p, "tcp", addrs[0], startTimeout)
	}
}

func setupFasthttp(h *harness, rc *rowCtx) error {
	addrs, err := freeAddrs(1)
	if err != nil {
		return err
	}
	p, err := h.startSUT("fhproxy", filepath.Join(rc.dir, "fhproxy.log"), h.goEnv(),
		h.bin("fhproxy"), "-listen", addrs[0], "-upstream", rc.upstream)
	if err != nil {
		return err
	}
	rc.proxy, rc.target = p, "http://"+addrs[0]
	return waitDial(p, "tcp", addrs[0], startTimeout)
}

// setupLoop starts cmd/loopproxy, with the SDK agent (and its extra
// arguments agentArgs) when agent is set.
func setupLoop(agent bool, agentArgs ...string) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error {
		addrs, err := freeAddrs(1)
		if err != nil {
			return err
		}
		args := []string{h.bin("loopproxy"), "-listen", addrs[0], "-upstream", rc.upstream}
		if agent {
			sock := filepath.Join(rc.dir, "sdkagent.sock")
			if err := startAgent(h, rc, "sdkagent", sock, append([]string{"-socket", sock}, agentArgs...)...); err != nil {
				return err
			}
			args = append(args, "-agent", sock)
		}
		p, err := h.startSUT("loopproxy", filepath.Join(rc.dir, "loopproxy.log"), h.goEnv(), args...)
		if err != nil {
			return err
		}
		rc.proxy, rc.target = p, "http://"+addrs[0]
		return waitDial(p, "tcp", addrs[0], startTimeout)
	}
}

const sidecarCfg = `listeners:
  - name: public
    address: {{.Listen}}
{{- if .H2}}
    protocols: [http1, h2c]
{{- end}}
upstreams:
  - name: app
    address: {{.Upstream}}
{{- if .GRPC}}
    protocol: h2c
{{- end}}
{{- if .AuthURL}}
agents:
  - name: peers
    transport: http_auth
    address: {{.AuthURL}}
    failure_mode: closed
    options:
      auth_response_headers: X-Agent-Processed
{{- if .Pipeline}}
      pipeline: "{{.Pipeline}}"
{{- end}}
{{- if .AuthSock}}
      unix_socket: {{.AuthSock}}
{{- end}}
{{- else if .Agent}}
agents:
  - name: peers
    transport: uds
    address: {{.AgentSock}}
    failure_mode: closed
{{- if .JSON}}
    payload_encoding: json
{{- end}}
{{- end}}
routes:
  - name: default
    upstream: app
{{- if .Agent}}
    agents: [peers]
{{- end}}
admin:
  address: {{.Admin}}
logging:
  level: warn
`

// setupSidecar starts the sidecar binary sidecarBin, with the agent
// binary agentBin ("": no agent); json keeps the agent connection on JSON
// payloads (payload_encoding: json), as with an agent that does not
// declare supports_protobuf_payloads.
func setupSidecar(sidecarBin, agentBin string, json bool, agentArgs ...string) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error { return sidecarRow(h, rc, sidecarBin, agentBin, json, agentArgs) }
}

// sidecarRow starts the sidecar binary sidecarBin, with the SDK agent
// binary agentBin and its extra arguments agentArgs unless agentBin is ""
// (on JSON payloads when json is set); an agentBin named authserver… is
// the auth server, asked by an http_auth agent.
func sidecarRow(h *harness, rc *rowCtx, sidecarBin, agentBin string, json bool, agentArgs []string) error {
	return sidecarRowAuth(h, rc, sidecarBin, agentBin, json, agentArgs, false)
}

// sidecarRowAuth is sidecarRow; with authUnix, the auth server listens on
// a Unix socket (option unix_socket), as in the nginx-auth row.
func sidecarRowAuth(h *harness, rc *rowCtx, sidecarBin, agentBin string, json bool, agentArgs []string, authUnix bool) error {
	return sidecarRowPipe(h, rc, sidecarBin, agentBin, json, agentArgs, authUnix, 0)
}

// sidecarRowPipe is sidecarRowAuth; pipeline > 0 sets the http_auth
// agent's option pipeline.
func sidecarRowPipe(h *harness, rc *rowCtx, sidecarBin, agentBin string, json bool, agentArgs []string, authUnix bool, pipeline int) error {
	agent := agentBin != ""
	addrs, err := freeAddrs(3)
	if err != nil {
		return err
	}
	data := map[string]any{
		"Listen": addrs[0], "Admin": addrs[1], "Upstream": rc.upstream, "Agent": agent, "JSON": json, "H2": rc.h2, "GRPC": rc.grpc,
		"AgentSock": filepath.Join(rc.dir, "sdkagent.sock"), "AuthURL": "", "AuthSock": "", "Pipeline": pipeline,
	}
	switch {
	case strings.HasPrefix(agentBin, "authserver") && authUnix:
		sock := filepath.Join(rc.dir, "auth.sock")
		if err := startAgent(h, rc, agentBin, sock, "-listen", "unix:"+sock); err != nil {
			return err
		}
		data["AuthURL"], data["AuthSock"] = "http://auth/auth", sock
	case strings.HasPrefix(agentBin, "authserver"):
		// The auth server of the nginx and Caddy rows, on a loopback port
		// instead of their Unix socket.
		p, err := h.startSUT(agentBin, filepath.Join(rc.dir, agentBin+".log"), h.goEnv(),
			h.bin(agentBin), "-listen", addrs[2])
		if err != nil {
			return err
		}
		rc.agent = p
		if err := waitDial(p, "tcp", addrs[2], startTimeout); err != nil {
			return err
		}
		data["AuthURL"] = "http://" + addrs[2] + "/auth"
	case agent:
		args := append([]string{"-socket", data["AgentSock"].(string)}, agentArgs...)
		if err := startAgent(h, rc, agentBin, data["AgentSock"].(string), args...); err != nil {
			return err
		}
	}
	cfg, err := writeTemplate(rc.dir, "sidecar.yaml", sidecarCfg, data)
	if err != nil {
		return err
	}
	p, err := h.startSUT(sidecarBin, filepath.Join(rc.dir, sidecarBin+".log"), h.goEnv(),
		h.bin(sidecarBin), "run", "-config", cfg)
	if err != nil {
		return err
	}
	rc.proxy, rc.target = p, "http://"+addrs[0]
	// Ready: listening, and the fail-closed agent connected.
	return waitHTTP200(p, "http://"+addrs[1]+"/readyz", startTimeout)
}

// setupSidecarHTTPAuth starts the sidecar binary sidecarBin with an
// http_auth agent asking authBin, the auth server of the nginx-auth and
// caddy-auth rows, whose X-Agent-Processed it copies onto the upstream
// request: on a Unix socket as theirs when unix, else on a loopback port.
func setupSidecarHTTPAuth(sidecarBin, authBin string, unix bool) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error {
		return sidecarRowAuth(h, rc, sidecarBin, authBin, false, nil, unix)
	}
}

// setupSidecarHTTPAuthPipe is setupSidecarHTTPAuth on the Unix socket
// with the http_auth option pipeline set to n.
func setupSidecarHTTPAuthPipe(sidecarBin, authBin string, n int) func(*harness, *rowCtx) error {
	return func(h *harness, rc *rowCtx) error {
		return sidecarRowPipe(h, rc, sidecarBin, authBin, false, nil, true, n)
	}
}

// startSUT starts a proxy or an agent: on the proxy CPUs, under the
// scheduling policy of -sched.
func (h *harness) startSUT(name, logPath string, env []string, argv ...string) (*proc, error) {
	if h.sched == "batch" {
		argv = append([]string{"chrt", "-b", "0"}, argv...)
	}
	return h.procs.start(name, h.proxyCPUs, logPath, env, argv...)
}
