package transports_test

import (
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
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
