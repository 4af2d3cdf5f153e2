package bench

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"time"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// The TLS listener row: the baseline sidecar (no agent) serving HTTPS on
// keep-alive connections, compared with the same sidecar over plain HTTP.
// The handshake happens once per connection, so the row prices the
// per-request record encryption and the extra buffer copies.
func init() {
	Register(Row{
		Name:   "sidecar, no agent, TLS listener",
		Order:  110,
		Versus: "sidecar, no agent",
		Setup:  tlsRow,
	})
}

func tlsRow(env *Env) (string, error) {
	certFile, keyFile, pool, err := selfSigned(env.Dir, "bench.local")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrBenchSetup, err)
	}
	cfg := env.Config()
	cfg.Listeners[0].TLS = &config.ListenerTLS{Certificates: []config.TLSCertificate{{CertFile: certFile, KeyFile: keyFile}}}
	env.ClientTLS = &tls.Config{RootCAs: pool, ServerName: "bench.local", MinVersion: tls.VersionTLS12}
	return env.StartSidecar(cfg, nil)
}

// selfSigned writes a self-signed ECDSA P-256 certificate for name into
// dir and returns its files and a pool that trusts it.
func selfSigned(dir, name string) (certFile, keyFile string, pool *x509.CertPool, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, IsCA: true, BasicConstraintsValid: true,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return "", "", nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", nil, err
	}
	certFile, keyFile = filepath.Join(dir, "tls.pem"), filepath.Join(dir, "tls-key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		return "", "", nil, err
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		return "", "", nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return "", "", nil, err
	}
	pool = x509.NewCertPool()
	pool.AddCert(cert)
	return certFile, keyFile, pool, nil
}
