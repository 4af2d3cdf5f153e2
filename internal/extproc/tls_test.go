package extproc_test

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestTLS runs a request to the processor over TLS and mTLS, and checks
// that a client without the certificate mTLS requires, or trusting
// another CA, never gets a connection.
func TestTLS(t *testing.T) {
	ca := testutil.NewPKI(t, "test")
	server := ca.Server(t, "proc", "127.0.0.1")
	client := ca.Client(t, "client", "sidecar")
	other := testutil.NewPKI(t, "other")
	for _, tc := range []struct {
		name string
		mtls bool
		cfg  grpcclient.TLSConfig
		ok   bool
	}{
		{"tls", false, grpcclient.TLSConfig{CAFile: ca.CAFile}, true},
		{"mtls", true, grpcclient.TLSConfig{CAFile: ca.CAFile, CertFile: client.CertFile, KeyFile: client.KeyFile}, true},
		{"mtls without client certificate", true, grpcclient.TLSConfig{CAFile: ca.CAFile}, false},
		{"unknown CA", false, grpcclient.TLSConfig{CAFile: other.CAFile}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stc := &tls.Config{Certificates: []tls.Certificate{server.TLS}, MinVersion: tls.VersionTLS12}
			if tc.mtls {
				stc.ClientAuth = tls.RequireAndVerifyClientCert
				stc.ClientCAs = ca.Pool
			}
			p, addr, _ := startProcessor(t, continueAll, stc)
			cfg := extproc.DefaultConfig("proc", addr)
			cfg.TLS = tc.cfg
			c, err := extproc.NewClient(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			wait := 5 * time.Second
			if !tc.ok {
				wait = time.Second // it is not expected to come up
			}
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			if !tc.ok {
				// TLS 1.3 lets a client finish its handshake before the
				// server refuses the certificate, so the connection may
				// look ready for a moment: the request must fail and the
				// processor must see nothing.
				if c.WaitReady(ctx) == nil {
					ex, err := c.Begin(waitFor())
					if err == nil {
						_, err = ex.RequestHeaders(waitFor(), reqHeaders(false))
						ex.Finish()
					}
					if err == nil {
						t.Fatal("request succeeded without a valid TLS setup")
					}
				}
				if n := len(p.received()); n != 0 {
					t.Errorf("processor got %d messages", n)
				}
				return
			}
			if err := c.WaitReady(ctx); err != nil {
				t.Fatal(err)
			}
			ex, err := c.Begin(waitFor())
			if err != nil {
				t.Fatal(err)
			}
			defer ex.Finish()
			if _, err := ex.RequestHeaders(waitFor(), reqHeaders(false)); err != nil {
				t.Fatal(err)
			}
			if len(p.received()) != 1 {
				t.Error("processor did not get the request")
			}
		})
	}
}
