package testutil

import (
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
	"sync/atomic"
	"testing"
	"time"
)

// PKI is a certificate authority made for one test, its files in Dir.
type PKI struct {
	Dir    string
	CAFile string // the CA certificate, PEM
	CA     *x509.Certificate
	Pool   *x509.CertPool // holds CA
	key    *ecdsa.PrivateKey
}

// Cert is a certificate issued by a PKI, in memory and on disk.
type Cert struct {
	TLS      tls.Certificate
	CertFile string // PEM
	KeyFile  string // PEM, EC private key
}

var serial atomic.Int64

// NewPKI makes a CA called name, valid for an hour either side of now.
func NewPKI(t testing.TB, name string) *PKI {
	t.Helper()
	p := &PKI{Dir: SocketDir(t), key: newKey(t)}
	p.CA = issue(t, &x509.Certificate{
		Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil, &p.key.PublicKey, p.key)
	p.Pool = x509.NewCertPool()
	p.Pool.AddCert(p.CA)
	p.CAFile = filepath.Join(p.Dir, name+"-ca.pem")
	writePEM(t, p.CAFile, "CERTIFICATE", p.CA.Raw)
	return p
}

// Server issues a server certificate for names (IP addresses become IP
// SANs), files named after file.
func (p *PKI) Server(t testing.TB, file string, names ...string) Cert {
	t.Helper()
	return p.leaf(t, file, file, x509.ExtKeyUsageServerAuth, names)
}

// Client issues a client certificate with common name cn.
func (p *PKI) Client(t testing.TB, file, cn string) Cert {
	t.Helper()
	return p.leaf(t, file, cn, x509.ExtKeyUsageClientAuth, nil)
}

func (p *PKI) leaf(t testing.TB, file, cn string, usage x509.ExtKeyUsage, names []string) Cert {
	t.Helper()
	k := newKey(t)
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: cn}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	for _, n := range names {
		if ip := net.ParseIP(n); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, n)
		}
	}
	c := issue(t, tmpl, p.CA, &k.PublicKey, p.key)
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	out := Cert{
		TLS:      tls.Certificate{Certificate: [][]byte{c.Raw}, PrivateKey: k, Leaf: c},
		CertFile: filepath.Join(p.Dir, file+".pem"),
		KeyFile:  filepath.Join(p.Dir, file+"-key.pem"),
	}
	writePEM(t, out.CertFile, "CERTIFICATE", c.Raw)
	writePEM(t, out.KeyFile, "EC PRIVATE KEY", kder)
	return out
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func issue(t testing.TB, tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) *x509.Certificate {
	tmpl.SerialNumber = big.NewInt(serial.Add(1))
	tmpl.NotBefore = time.Now().Add(-time.Hour)
	tmpl.NotAfter = time.Now().Add(time.Hour)
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
