package reverse

import (
	"context"
	"crypto/tls"
	"net"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

type pki struct {
	ca, serverCert, serverKey, clientCert, clientKey, otherCert, otherKey string
}

// newPKI writes a CA, a server certificate for 127.0.0.1, a client
// certificate signed by the CA and one signed by an unrelated CA.
func newPKI(t *testing.T) pki {
	t.Helper()
	ca, other := testutil.NewPKI(t, "test"), testutil.NewPKI(t, "other")
	server := ca.Server(t, "server", "127.0.0.1")
	client := ca.Client(t, "client", "waf-1")
	stranger := other.Client(t, "other", "waf-1")
	return pki{
		ca: ca.CAFile, serverCert: server.CertFile, serverKey: server.KeyFile,
		clientCert: client.CertFile, clientKey: client.KeyFile,
		otherCert: stranger.CertFile, otherKey: stranger.KeyFile,
	}
}

func TestMutualTLS(t *testing.T) {
	p := newPKI(t)
	cfg := testConfig(t)
	cfg.UnixPath = ""
	cfg.TCPAddr = "127.0.0.1:0"
	cfg.TLS = &TLSConfig{CertFile: p.serverCert, KeyFile: p.serverKey, ClientCAFile: p.ca}
	cfg.RegistrationTimeout = time.Second
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()
	a := l.Agent("waf")

	good, err := sdk.LoadClientTLS(p.ca, p.clientCert, p.clientKey, "")
	if err != nil {
		t.Fatal(err)
	}
	runAgent(t, addr, "waf-1", testToken, newHandler("waf-1"), func(c *sdk.ReverseConfig) { c.TLS = good })
	testutil.WaitFor(t, "mTLS registration", func() bool { return a.Snapshot().Connections == 1 })
	if got, err := call(context.Background(), a); err != nil || got != "waf-1" {
		t.Fatalf("call over mTLS: %q, %v", got, err)
	}

	// A client certificate from another CA, no client certificate, and
	// plain TCP are all stopped at the TLS layer.
	wrongCA, err := sdk.LoadClientTLS(p.ca, p.otherCert, p.otherKey, "")
	if err != nil {
		t.Fatal(err)
	}
	noCert, err := sdk.LoadClientTLS(p.ca, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	for i, tc := range []*tls.Config{wrongCA, noCert, nil} {
		var nc net.Conn
		if tc == nil {
			nc, err = net.Dial("tcp", addr)
		} else {
			nc, err = tls.Dial("tcp", addr, tc)
		}
		if err != nil {
			continue // refused during the handshake: as good as later
		}
		_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
		c := &rawConn{t: t, nc: nc}
		c.send(protocol.TypeRegistrationRequest, regReq("waf-9", testToken))
		buf := make([]byte, 64)
		if n, err := nc.Read(buf); err == nil && tc != nil {
			t.Errorf("case %d: the proxy answered %q without a valid client certificate", i, buf[:n])
		}
		_ = nc.Close()
		testutil.WaitFor(t, "tls error counted", func() bool { return l.Stats().TLSErrors == uint64(i+1) })
	}
	if s := l.Stats(); s.Accepted != 1 || a.Snapshot().Connections != 1 {
		t.Errorf("stats %+v", s)
	}
}

func TestPlainTCP(t *testing.T) {
	cfg := testConfig(t)
	cfg.UnixPath = ""
	cfg.TCPAddr = "127.0.0.1:0"
	l := startListener(t, cfg)
	a := l.Agent("waf")
	runAgent(t, l.TCPAddr().String(), "waf-1", testToken, newHandler("waf-1"), nil)
	testutil.WaitFor(t, "tcp registration", func() bool { return a.Snapshot().Connections == 1 })
	if got, err := call(context.Background(), a); err != nil || got != "waf-1" {
		t.Fatalf("call over tcp: %q, %v", got, err)
	}
}
