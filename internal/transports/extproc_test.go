package transports_test

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/extproc"
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
		{`      request_attributes: "destination.address"`, "not supported"},
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
