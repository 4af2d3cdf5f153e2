package grpcclient_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/sdk"
)

// testPKI is a CA with a server and a client certificate, made per test.
type testPKI struct {
	dir                  string
	caFile               string
	caPool               *x509.CertPool
	serverCert           tls.Certificate
	clientCert, clientKy string
}

// newPKI makes a CA, a server certificate for serverNames (IP addresses
// become IP SANs) and a client certificate, with the CA and the client's
// pair written to files.
func newPKI(t *testing.T, serverNames ...string) *testPKI {
	t.Helper()
	ca := testutil.NewPKI(t, "test")
	server := ca.Server(t, "agent", serverNames...)
	client := ca.Client(t, "client", "sidecar")
	return &testPKI{dir: ca.Dir, caFile: ca.CAFile, caPool: ca.Pool, serverCert: server.TLS, clientCert: client.CertFile, clientKy: client.KeyFile}
}

// serverCreds is the agent's TLS; mtls requires a client certificate
// signed by the CA.
func (p *testPKI) serverCreds(mtls bool) grpc.ServerOption {
	tc := &tls.Config{Certificates: []tls.Certificate{p.serverCert}, MinVersion: tls.VersionTLS12}
	if mtls {
		tc.ClientAuth = tls.RequireAndVerifyClientCert
		tc.ClientCAs = p.caPool
	}
	return grpc.Creds(credentials.NewTLS(tc))
}

// TestTLS runs one request over TLS and mTLS, and checks that the wrong
// setups are refused: no client certificate under mTLS, an unknown CA,
// a certificate for another name, plaintext against TLS.
func TestTLS(t *testing.T) {
	cases := []struct {
		name       string
		serverName []string // SANs of the agent's certificate
		mtls       bool
		tls        func(p *testPKI) grpcclient.TLSConfig
		ok         bool
		why        string // expected in the last error when refused
	}{
		{"tls", []string{"127.0.0.1"}, false, func(p *testPKI) grpcclient.TLSConfig {
			return grpcclient.TLSConfig{CAFile: p.caFile}
		}, true, ""},
		{"tls server name override", []string{"agent.internal"}, false, func(p *testPKI) grpcclient.TLSConfig {
			return grpcclient.TLSConfig{CAFile: p.caFile, ServerName: "agent.internal"}
		}, true, ""},
		{"mtls", []string{"127.0.0.1"}, true, func(p *testPKI) grpcclient.TLSConfig {
			return grpcclient.TLSConfig{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.clientKy}
		}, true, ""},
		// TLS 1.3: the client's handshake is over before the server checks
		// the client certificate, so the server's refusal reaches the client
		// as its alert or, when the server has already closed, as a broken
		// pipe or reset on the client's first write.
		{"mtls without client certificate", []string{"127.0.0.1"}, true, func(p *testPKI) grpcclient.TLSConfig {
			return grpcclient.TLSConfig{CAFile: p.caFile}
		}, false, "certificate|broken pipe|connection reset by peer"},
		{"unknown CA", []string{"127.0.0.1"}, false, func(p *testPKI) grpcclient.TLSConfig {
			other := newPKI(t, "127.0.0.1")
			return grpcclient.TLSConfig{CAFile: other.caFile}
		}, false, "certificate"},
		{"wrong server name", []string{"other.internal"}, false, func(p *testPKI) grpcclient.TLSConfig {
			return grpcclient.TLSConfig{CAFile: p.caFile}
		}, false, "certificate"},
		{"plaintext client", []string{"127.0.0.1"}, false, func(p *testPKI) grpcclient.TLSConfig {
			return grpcclient.TLSConfig{}
		}, false, "Unavailable"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPKI(t, c.serverName...)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			serveAgent(t, ln, &sdk.Base{Caps: testCaps}, p.serverCreds(c.mtls))
			cfg := grpcclient.DefaultConfig("tls", ln.Addr().String())
			cfg.TLS = c.tls(p)
			cl, err := grpcclient.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if !c.ok {
				waitLastError(t, cl, c.why)
				if cl.Len() != 0 {
					t.Fatal("refused client has a live connection")
				}
				return
			}
			ctx, cancel := waitCtx()
			defer cancel()
			if err := cl.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			if _, err := roundTrip(t, cl, "/secure"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTLSConfigFiles: unreadable or empty files fail NewClient at once.
func TestTLSConfigFiles(t *testing.T) {
	p := newPKI(t, "127.0.0.1")
	empty := filepath.Join(p.dir, "empty.pem")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		tls  grpcclient.TLSConfig
	}{
		{"missing CA file", grpcclient.TLSConfig{CAFile: filepath.Join(p.dir, "nope.pem")}},
		{"CA file without certificates", grpcclient.TLSConfig{CAFile: empty}},
		{"key does not match", grpcclient.TLSConfig{CAFile: p.caFile, CertFile: p.clientCert, KeyFile: p.caFile}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := grpcclient.DefaultConfig("tls", "127.0.0.1:1")
			cfg.TLS = c.tls
			if _, err := grpcclient.NewClient(cfg); !errors.Is(err, grpcclient.ErrGRPCConfig) {
				t.Fatalf("NewClient: %v, want ErrGRPCConfig", err)
			}
		})
	}
}
