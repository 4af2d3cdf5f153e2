package reverse

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

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
	dir := shortDir(t)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	serial := int64(1)
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		k := newKey()
		serial++
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
		if err != nil {
			t.Fatal(err)
		}
		c, _ := x509.ParseCertificate(der)
		return c, k, der
	}
	leaf := func(ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string, usage x509.ExtKeyUsage) ([]byte, *ecdsa.PrivateKey) {
		k := newKey()
		serial++
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, k
	}
	ca, caKey, caDER := newCA("test ca")
	other, otherKey, _ := newCA("other ca")
	var p pki
	p.ca = write("ca.pem", "CERTIFICATE", caDER)
	der, k := leaf(ca, caKey, "proxy", x509.ExtKeyUsageServerAuth)
	p.serverCert, p.serverKey = write("server.pem", "CERTIFICATE", der), write("server.key", "EC PRIVATE KEY", keyDER(k))
	der, k = leaf(ca, caKey, "waf-1", x509.ExtKeyUsageClientAuth)
	p.clientCert, p.clientKey = write("client.pem", "CERTIFICATE", der), write("client.key", "EC PRIVATE KEY", keyDER(k))
	der, k = leaf(other, otherKey, "waf-1", x509.ExtKeyUsageClientAuth)
	p.otherCert, p.otherKey = write("other.pem", "CERTIFICATE", der), write("other.key", "EC PRIVATE KEY", keyDER(k))
	return p
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
	waitFor(t, "mTLS registration", func() bool { return a.Snapshot().Connections == 1 })
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
		waitFor(t, "tls error counted", func() bool { return l.Stats().TLSErrors == uint64(i+1) })
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
	waitFor(t, "tcp registration", func() bool { return a.Snapshot().Connections == 1 })
	if got, err := call(context.Background(), a); err != nil || got != "waf-1" {
		t.Fatalf("call over tcp: %q, %v", got, err)
	}
}
