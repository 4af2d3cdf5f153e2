package upstream

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// TLS to upstreams: the dial function of every endpoint (upstreamDial)
// is wrapped so that each new connection does its TLS handshake inside
// the dial, under connect_timeout, before fasthttp sees it. fasthttp's own
// TLS (HostClient.IsTLS) is not used: the connection the request path
// drives must be the upConn that caches its deadlines.

// withUpstreamTLS wraps dial with the client side of TLS when u says so.
// A TLS setting that cannot be loaded (the files changed since Validate)
// makes every dial fail with that error: 502 and a log line per request,
// rather than plain HTTP to a service that expects TLS.
func withUpstreamTLS(u *config.Upstream, addr string, dial fasthttp.DialFunc) fasthttp.DialFunc {
	if u.TLS == nil {
		return dial
	}
	conf, err := upstreamTLSConfig(u.TLS, addr)
	h2 := u.Protocol == config.ProtoH2
	if err == nil && h2 {
		conf.NextProtos = []string{"h2"}
	}
	if err != nil {
		err = fmt.Errorf("upstream %s: %w", u.Name, err)
		return func(string) (net.Conn, error) { return nil, err }
	}
	timeout := u.ConnectTimeout
	return func(a string) (net.Conn, error) {
		start := time.Now()
		c, err := dial(a)
		if err != nil {
			return nil, err
		}
		raw := c
		uc, wrapped := c.(*upConn)
		if wrapped {
			raw = uc.Conn
		}
		tc := tls.Client(raw, conf)
		ctx, cancel := context.WithDeadline(context.Background(), start.Add(timeout))
		defer cancel()
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("upstream TLS handshake with %s: %w", a, err)
		}
		if h2 && tc.ConnectionState().NegotiatedProtocol != "h2" {
			_ = raw.Close()
			return nil, fmt.Errorf("upstream TLS handshake with %s: %w", a, errNoH2)
		}
		if wrapped {
			uc.Conn = tc
			return uc, nil
		}
		return tc, nil
	}
}

// errNoH2 is an upstream of protocol h2 whose TLS handshake did not pick
// h2 by ALPN.
var errNoH2 = errors.New("the upstream did not agree to h2 by ALPN")

// upstreamTLSConfig builds the client configuration of an upstream.
func upstreamTLSConfig(t *config.UpstreamTLS, addr string) (*tls.Config, error) {
	minV, err := config.TLSVersion(t.MinVersion)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTLSConfig, err)
	}
	suites, err := config.CipherSuiteIDs(t.CipherSuites)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errTLSConfig, err)
	}
	conf := &tls.Config{
		MinVersion:         minV,
		CipherSuites:       suites,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify, //nolint:gosec // opt-in, warned about at start and reload
		NextProtos:         []string{"http/1.1"},
	}
	if conf.ServerName == "" && !strings.HasPrefix(addr, "unix:") {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			host = addr
		}
		conf.ServerName = host
	}
	if t.CAFile != "" {
		pool, err := config.LoadCertPool(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: ca_file: %v", errTLSConfig, err)
		}
		conf.RootCAs = pool
	}
	if t.CertFile != "" {
		kp, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: client certificate %s / %s: %v", errTLSConfig, t.CertFile, t.KeyFile, err)
		}
		conf.Certificates = []tls.Certificate{kp}
	}
	return conf, nil
}

// upstreamTLSKey identifies an upstream's TLS settings and the state of
// their files, so that a reload after a CA or client certificate change
// builds new connection pools.
func upstreamTLSKey(u *config.Upstream) string {
	t := u.TLS
	if t == nil {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s|%s|%v|%s|%v", t.ServerName, t.MinVersion, t.InsecureSkipVerify, strings.Join(t.CipherSuites, ","), t.CertFile)
	for _, st := range statFiles([]string{t.CAFile, t.CertFile, t.KeyFile}) {
		fmt.Fprintf(&b, "|%s:%d:%d", st.path, st.mod.UnixNano(), st.size)
	}
	return b.String()
}

// WarnInsecure logs, at every start and reload, each upstream
// whose certificate is not verified.
func WarnInsecure(cfg *config.Config, log zerolog.Logger) {
	for _, u := range cfg.Upstreams {
		if u.TLS != nil && u.TLS.InsecureSkipVerify {
			log.Warn().Str("upstream", u.Name).
				Msg("INSECURE: upstream TLS certificate is NOT verified (insecure_skip_verify: true); anyone on the path can impersonate this upstream")
		}
	}
}
