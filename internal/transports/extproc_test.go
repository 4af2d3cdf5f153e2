package transports_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/zentinelproxy/sidecar/internal/admin"
	"github.com/zentinelproxy/sidecar/internal/agentmux"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// TestExtProcOptions: check-config validates the ext_proc options and
// refuses what the proxy cannot carry, naming the line.
func TestExtProcOptions(t *testing.T) {
	const tmpl = `
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: proc
    transport: ext_proc
    address: 127.0.0.1:50051
    options:
OPTIONS
routes:
  - name: r
    upstream: app
    agents: [proc]
`
	for _, tc := range []struct {
		opts string
		want string // "" valid, else in the error
	}{
		{`      processing_mode: "request_header_mode=SEND,response_header_mode=SKIP,request_body_mode=BUFFERED,response_body_mode=STREAMED"
      allowed_override_modes: "response_body_mode=NONE;request_body_mode=BUFFERED_PARTIAL"
      request_attributes: "request.path,source.address"
      response_attributes: "response.code"
      metadata: "tenant/id=t1,tenant/zone=eu"
      buffer_limit: "65536"
      tls: "true"
      tls_server_name: proc.internal`, ""},
		{`      nonsense: "1"`, "unknown option"},
		{`      processing_mode: "request_trailer_mode=SEND"`, "trailer"},
		{`      processing_mode: "request_body_mode=FULL_DUPLEX_STREAMED"`, "FULL_DUPLEX_STREAMED"},
		{`      processing_mode: "request_body_mode=SOMETIMES"`, "unknown body mode"},
		{`      allowed_override_modes: "response_trailer_mode=SEND"`, "allowed_override_modes[0]"},
		{`      request_attributes: "destination.address,destination.port"`, ""},
		{`      request_attributes: "connection.id"`, "not supported"},
		// Each refusal names the option's own line (the template's
		// options start on line 13).
		{`      request_attributes: "request.path,response.code"`, `line 13: agents[0].options.request_attributes: extproc: invalid config: option request_attributes: attribute "response.code" is not supported in request_attributes`},
		{`      buffer_limit: "65536"
      response_attributes: "request.path,request.duration"`, `line 14: agents[0].options.response_attributes: extproc: invalid config: option response_attributes: attribute "request.duration" is not supported: the request's duration is only known once it has ended`},
		{`      request_attributes: "connection.termination_details"`, "connection is still open"},
		{`      response_attributes: "response.backend_latency"`, "whole response"},
		{`      request_attributes: "request.bogus"`, `attribute "request.bogus" is unknown`},
		{`      response_attributes: "xds.virtual_host_name"`, "no virtual hosts"},
		{`      request_attributes: "` + strings.Join(extproc.RequestAttributes, ",") + `"
      response_attributes: "` + strings.Join(extproc.ResponseAttributes, ",") + `"`, ""},
		{`      metadata: "nonamespace=1"`, "namespace/key=value"},
		{`      buffer_limit: "12"`, "buffer_limit"},
		{`      tls_cert_file: /x.pem`, "go together"},
		{`      tls_server_name: x`, "without tls"},
		{`      allow_mode_override: "maybe"`, "allow_mode_override"},
	} {
		cfg, err := config.Parse([]byte(strings.Replace(tmpl, "OPTIONS", tc.opts, 1)))
		if err != nil {
			t.Fatalf("%s: %v", tc.opts, err)
		}
		err = transports.Check(cfg)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.opts, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "line ")):
			t.Errorf("%s: error %v, want one with %q and a line", tc.opts, err, tc.want)
		}
	}
}

// echoProcessor is a minimal processor: it ends each stream when the
// client half-closes it and answers nothing else (the probe needs no
// more).
type echoProcessor struct {
	extprocsvc.UnimplementedExternalProcessorServer
}

func (echoProcessor) Process(s extprocsvc.ExternalProcessor_ProcessServer) error {
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
	}
}

// serveGRPC serves srv on loopback TCP until the test ends.
func serveGRPC(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return ln.Addr().String()
}

// TestExtProcReadiness: an ext_proc agent whose server does not implement
// ExternalProcessor keeps the sidecar not ready, /readyz and /status
// saying why; with a processor there it is ready.
func TestExtProcReadiness(t *testing.T) {
	for _, tc := range []struct {
		name      string
		processor bool
	}{{"not a processor", false}, {"processor", true}} {
		t.Run(tc.name, func(t *testing.T) {
			addr := serveGRPC(t, func(s *grpc.Server) {
				healthpb.RegisterHealthServer(s, health.NewServer())
				if tc.processor {
					extprocsvc.RegisterExternalProcessorServer(s, echoProcessor{})
				}
			})
			cfg, err := config.Parse([]byte(`
listeners:
  - name: l
    address: 127.0.0.1:0
upstreams:
  - name: app
    address: 127.0.0.1:9
agents:
  - name: proc
    transport: ext_proc
    address: ` + addr + `
routes:
  - name: r
    upstream: app
    agents: [proc]
`))
			if err != nil {
				t.Fatal(err)
			}
			a, err := transports.Dialing()[config.TransportExtProc](cfg.Agent("proc"), zerolog.Nop())
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			required := admin.FailClosedAgents(cfg)
			srv, err := admin.New(admin.Config{
				Address: "127.0.0.1:0",
				Ready:   func() (bool, string) { return admin.AgentsReady([]agentmux.AgentStatus{a.Snapshot()}, required) },
				Agents:  func() []agentmux.AgentStatus { return []agentmux.AgentStatus{a.Snapshot()} },
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
			}()
			base := "http://" + srv.Addr().String()
			get := func(path string) (int, map[string]any) {
				resp, err := http.Get(base + path)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				var m map[string]any
				if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
					t.Fatalf("%s: %v", path, err)
				}
				return resp.StatusCode, m
			}
			want := 200
			if !tc.processor {
				want = 503
			}
			var code int
			var ready map[string]any
			testutil.WaitFor(t, "the probe's verdict", func() bool {
				code, ready = get("/readyz")
				st := a.Snapshot()
				return (tc.processor && code == 200) || (!tc.processor && strings.Contains(st.LastError, "ExternalProcessor"))
			})
			if code, ready = get("/readyz"); code != want {
				t.Fatalf("/readyz %d %v, want %d", code, ready, want)
			}
			_, status := get("/status")
			agents, _ := status["agents"].([]any)
			if len(agents) != 1 {
				t.Fatalf("/status agents %v", status["agents"])
			}
			ag, _ := agents[0].(map[string]any)
			if tc.processor {
				if ag["ready"] != true || status["ready"] != true {
					t.Errorf("/status %v", status)
				}
				return
			}
			const why = "does not implement envoy.service.ext_proc.v3.ExternalProcessor"
			if r, _ := ready["reason"].(string); !strings.Contains(r, "proc") || !strings.Contains(r, why) {
				t.Errorf("/readyz reason %q", r)
			}
			if r, _ := status["not_ready_reason"].(string); status["ready"] != false || !strings.Contains(r, why) {
				t.Errorf("/status ready %v, reason %q", status["ready"], r)
			}
			if le, _ := ag["last_error"].(string); ag["ready"] != false || !strings.Contains(le, why) {
				t.Errorf("/status agent %v", ag)
			}
		})
	}
}
