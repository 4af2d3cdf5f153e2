package http1

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/dataplane/internal/ratelog"
	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/observe"
	"github.com/zentinelproxy/sidecar/internal/rawio"
)

// TLS on listeners. The listener accepts TCP connections and wraps each
// in a tls.Conn inside its eofConn; the handshake runs on the first read,
// under the read deadline fasthttp set for the request head. The eofConn
// keeps the TCP socket for the disconnect peek (peek_linux.go): any TLS
// record waiting on the socket reads as "still there", a FIN as gone.
//
// The material (certificates, client CAs, the tls.Config built from
// them) sits behind an atomic pointer that GetConfigForClient reads per
// handshake, so a rotation takes effect for the next handshake without a
// restart: on Swap (a reload), and when a poll every reload_interval sees
// a file's modification time or size change. A rotation that fails (a
// key written before its certificate) keeps the old material, is logged
// and counted, and is retried at the next poll.

// ErrTLSConfig is a listener or upstream TLS setting that cannot be
// loaded (a missing file, a bad PEM block, a key that does not match).
var ErrTLSConfig = errors.New("dataplane: TLS configuration")

type tlsCounters struct {
	handshakes, handshakeErrors, reloads, reloadErrors atomic.Uint64
	plainHTTP                                          atomic.Uint64
}

func (c *tlsCounters) snapshot() observe.TLSStats {
	return observe.TLSStats{
		Handshakes:      c.handshakes.Load(),
		HandshakeErrors: c.handshakeErrors.Load(),
		Reloads:         c.reloads.Load(),
		ReloadErrors:    c.reloadErrors.Load(),
		PlainHTTP:       c.plainHTTP.Load(),
	}
}

// listenerTLS is one listener's TLS material and its file watcher.
type listenerTLS struct {
	name  string
	log   zerolog.Logger
	stats *tlsCounters
	cur   atomic.Pointer[tlsMaterial]
	base  *tls.Config // hands out cur's config per handshake

	mu     sync.Mutex // guards cfg and stamps (reloads)
	cfg    config.ListenerTLS
	stamps []fileStamp
	errLog ratelog.Limit
	hsLog  ratelog.Limit // failed handshakes
	// protos are the ALPN protocols offered, in the server's order of
	// preference (alpnProtos).
	protos []string

	stop chan struct{}
	done chan struct{}
}

// tlsMaterial is one loaded generation of a listener's TLS settings.
type tlsMaterial struct {
	conf  *tls.Config
	certs []*tls.Certificate
	exact map[string]*tls.Certificate
	wild  map[string]*tls.Certificate // "example.com" for *.example.com
}

type fileStamp struct {
	path string
	mod  time.Time
	size int64
}

func newListenerTLS(name string, cfg config.ListenerTLS, protos []string, log zerolog.Logger, stats *tlsCounters) (*listenerTLS, error) {
	lt := &listenerTLS{name: name, log: log, stats: stats, protos: protos, stop: make(chan struct{}), done: make(chan struct{})}
	lt.base = &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return lt.cur.Load().conf, nil
		},
	}
	if err := lt.load(cfg); err != nil {
		return nil, err
	}
	go lt.watch()
	return lt, nil
}

// load reads the files of cfg and makes them current.
func (lt *listenerTLS) load(cfg config.ListenerTLS) error {
	stamps := statFiles(tlsFiles(&cfg))
	m, err := buildMaterial(&cfg)
	if err != nil {
		return err
	}
	m.conf.NextProtos = lt.protos
	lt.mu.Lock()
	lt.cfg, lt.stamps = cfg, stamps
	lt.mu.Unlock()
	lt.cur.Store(m)
	lt.stats.reloads.Add(1)
	return nil
}

// reload is load for a rotation: a failure keeps the old material.
func (lt *listenerTLS) reload(cfg config.ListenerTLS, why string) {
	if err := lt.load(cfg); err != nil {
		lt.stats.reloadErrors.Add(1)
		if ok, suppressed := lt.errLog.Allow(); ok {
			e := lt.log.Error().Str("listener", lt.name).Err(err)
			if suppressed > 0 {
				e = e.Uint64("suppressed", suppressed)
			}
			e.Msg("TLS certificates not reloaded; the previous ones stay in use")
		}
		return
	}
	lt.log.Info().Str("listener", lt.name).Str("trigger", why).Msg("TLS certificates loaded")
}

// watch polls the files every reload_interval and reloads on a change.
func (lt *listenerTLS) watch() {
	defer close(lt.done)
	lt.mu.Lock()
	every := lt.cfg.ReloadInterval
	lt.mu.Unlock()
	tk := time.NewTicker(every)
	defer tk.Stop()
	for {
		select {
		case <-lt.stop:
			return
		case <-tk.C:
		}
		lt.mu.Lock()
		cfg, old := lt.cfg, lt.stamps
		lt.mu.Unlock()
		if every != cfg.ReloadInterval {
			every = cfg.ReloadInterval
			tk.Reset(every)
		}
		if !stampsEqual(old, statFiles(tlsFiles(&cfg))) {
			lt.reload(cfg, "file change")
		}
	}
}

func (lt *listenerTLS) close() {
	close(lt.stop)
	<-lt.done
}

func tlsFiles(c *config.ListenerTLS) []string {
	var out []string
	for _, ct := range c.Certificates {
		out = append(out, ct.CertFile, ct.KeyFile)
	}
	if c.ClientCAFile != "" {
		out = append(out, c.ClientCAFile)
	}
	return out
}

func statFiles(paths []string) []fileStamp {
	out := make([]fileStamp, len(paths))
	for i, p := range paths {
		out[i].path = p
		if fi, err := os.Stat(p); err == nil {
			out[i].mod, out[i].size = fi.ModTime(), fi.Size()
		}
	}
	return out
}

func stampsEqual(a, b []fileStamp) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].path != b[i].path || !a[i].mod.Equal(b[i].mod) || a[i].size != b[i].size {
			return false
		}
	}
	return true
}

func buildMaterial(cfg *config.ListenerTLS) (*tlsMaterial, error) {
	minV, err := config.TLSVersion(cfg.MinVersion)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTLSConfig, err)
	}
	suites, err := config.CipherSuiteIDs(cfg.CipherSuites)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTLSConfig, err)
	}
	m := &tlsMaterial{exact: map[string]*tls.Certificate{}, wild: map[string]*tls.Certificate{}}
	for _, c := range cfg.Certificates {
		kp, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("%w: loading %s / %s: %v", ErrTLSConfig, c.CertFile, c.KeyFile, err)
		}
		cert := &kp
		m.certs = append(m.certs, cert)
		names := c.ServerNames
		if len(names) == 0 && cert.Leaf != nil {
			names = cert.Leaf.DNSNames
		}
		for _, n := range names {
			n = strings.ToLower(n)
			if rest, ok := strings.CutPrefix(n, "*."); ok {
				if _, dup := m.wild[rest]; !dup {
					m.wild[rest] = cert
				}
			} else if _, dup := m.exact[n]; !dup {
				m.exact[n] = cert
			}
		}
	}
	if len(m.certs) == 0 {
		return nil, fmt.Errorf("%w: no certificate", ErrTLSConfig)
	}
	m.conf = &tls.Config{
		MinVersion:     minV,
		CipherSuites:   suites,
		GetCertificate: m.pick,
		NextProtos:     []string{"http/1.1"},
	}
	if cfg.ClientCAFile != "" {
		pool, err := config.LoadCertPool(cfg.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: client_ca_file: %v", ErrTLSConfig, err)
		}
		m.conf.ClientCAs = pool
		switch cfg.ClientAuth {
		case config.ClientAuthOptional:
			m.conf.ClientAuth = tls.VerifyClientCertIfGiven
		case config.ClientAuthRequire:
			m.conf.ClientAuth = tls.RequireAndVerifyClientCert
		}
	}
	return m, nil
}

// pick chooses the certificate for the client's SNI: an exact name, then
// a wildcard one label up, then the first certificate.
func (m *tlsMaterial) pick(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	name := strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	if name != "" {
		if c, ok := m.exact[name]; ok {
			return c, nil
		}
		if i := strings.IndexByte(name, '.'); i > 0 {
			if c, ok := m.wild[name[i+1:]]; ok {
				return c, nil
			}
		}
	}
	return m.certs[0], nil
}

// alpnProtos are the ALPN protocol IDs of a TLS listener serving cfg's
// protocols: h2 first, the server's preference (Go's TLS picks the
// server's first protocol the client offers).
func alpnProtos(cfg *config.Listener) []string {
	var p []string
	if cfg.Serves(config.ProtoH2) {
		p = append(p, "h2")
	}
	if cfg.Serves(config.ProtoHTTP1) || len(cfg.Protocols) == 0 {
		p = append(p, "http/1.1")
	}
	return p
}

// handshake runs the TLS handshake of a client connection (on its first
// read) and records its facts.
func (c *eofConn) handshake() error {
	c.hsDone = true
	lt := c.lt
	if err := c.tls.Handshake(); err != nil {
		if c.answerPlainHTTP(err) {
			return err
		}
		lt.stats.handshakeErrors.Add(1)
		if ok, suppressed := lt.hsLog.Allow(); ok {
			e := lt.log.Warn().Str("listener", lt.name).Str("client", c.raw.RemoteAddr().String())
			if suppressed > 0 {
				e = e.Uint64("suppressed", suppressed)
			}
			if desc, ok := c.hs.alert(); ok {
				// What crypto/tls reports of it ("bad record MAC") would
				// send an operator after the wrong cause.
				e.Str("alert", alertName(desc)).Msg("TLS handshake refused by the client (does it trust the listener's certificate?)")
			} else {
				e.Err(err).Msg("TLS handshake failed")
			}
		}
		c.hs.done = true
		return err
	}
	c.hs.done = true
	lt.stats.handshakes.Add(1)
	st := c.tls.ConnectionState()
	f := &exchange.TLSFacts{
		Version:    []byte(strings.ReplaceAll(tls.VersionName(st.Version), " ", "")),
		Cipher:     []byte(tls.CipherSuiteName(st.CipherSuite)),
		ServerName: []byte(st.ServerName),
	}
	if len(st.VerifiedChains) > 0 && len(st.PeerCertificates) > 0 {
		leaf := st.PeerCertificates[0]
		f.ClientSubject = []byte(leaf.Subject.String())
		f.ClientSAN = []byte(formatSAN(leaf))
	}
	c.facts = f
	return nil
}

// plainHTTPAnswer is the answer to plain HTTP sent to a TLS listener
// (nginx's words).
const plainHTTPAnswer = "HTTP/1.1 400 Bad Request\r\n" +
	"Content-Type: text/plain; charset=utf-8\r\n" +
	"Content-Length: 46\r\n" +
	"Connection: close\r\n\r\n" +
	"The plain HTTP request was sent to HTTPS port\n"

// plainHTTPWriteTimeout bounds the write of plainHTTPAnswer (it fits any
// socket buffer: only a client that never reads can reach it).
const plainHTTPWriteTimeout = 5 * time.Second

// answerPlainHTTP answers 400 on the TCP socket when the handshake failed
// because the client spoke plain HTTP, and marks the connection for a
// lingering close (the rest of its request may be arriving). It reports
// whether it did.
//
// crypto/tls tells that case apart on its own: the first 5 bytes it reads
// as a record header are not a handshake record and name no plausible
// version (a TLS record starts with 0x16 0x03), and it fails with a
// RecordHeaderError carrying the connection, unanswered. So the check
// costs a TLS client nothing: no peek, no extra system call; only a
// failed handshake looks at its bytes.
func (c *eofConn) answerPlainHTTP(err error) bool {
	var rhe tls.RecordHeaderError
	if !errors.As(err, &rhe) || rhe.Conn == nil || !looksLikeMethod(rhe.RecordHeader[:]) {
		return false
	}
	lt := c.lt
	lt.stats.plainHTTP.Add(1)
	if ok, suppressed := lt.hsLog.Allow(); ok {
		e := lt.log.Info().Str("listener", lt.name).Str("client", c.raw.RemoteAddr().String())
		if suppressed > 0 {
			e = e.Uint64("suppressed", suppressed)
		}
		e.Msg("plain HTTP on a TLS listener: answered 400")
	}
	_ = c.raw.SetWriteDeadline(time.Now().Add(plainHTTPWriteTimeout))
	if _, werr := io.WriteString(c.raw, plainHTTPAnswer); werr == nil {
		c.markLinger()
	}
	return true
}

// looksLikeMethod reports whether b, the first bytes of a connection,
// begin an HTTP/1 request line: a method of capital letters ("GET /",
// "POST ", "PRI *", "OPTIO"), which no TLS record begins with.
func looksLikeMethod(b []byte) bool {
	for i, ch := range b {
		if ch == ' ' {
			return i >= 3
		}
		if ch < 'A' || ch > 'Z' {
			return false
		}
	}
	return len(b) > 0
}

// handshakeFailed reports a TLS connection whose handshake did not
// complete: its read errors are not about HTTP.
func (c *eofConn) handshakeFailed() bool { return c.tls != nil && c.facts == nil }

// formatSAN lists a certificate's subject alternative names.
func formatSAN(c *x509.Certificate) string {
	var b strings.Builder
	add := func(kind, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(kind)
		b.WriteByte(':')
		b.WriteString(v)
	}
	for _, n := range c.DNSNames {
		add("DNS", n)
	}
	for _, u := range c.URIs {
		add("URI", u.String())
	}
	for _, ip := range c.IPAddresses {
		add("IP", ip.String())
	}
	for _, e := range c.EmailAddresses {
		add("email", e)
	}
	return b.String()
}

// wrapTLS starts the server side of TLS on an accepted connection.
func (l *eofListener) wrapTLS(c net.Conn) *eofConn {
	rc := rawio.Wrap(c)
	hs := &hsConn{Conn: rc}
	tc := tls.Server(hs, l.tls.base)
	e := newEOFConn(tc, rc, l.hdrBuf)
	e.raw, e.tls, e.lt, e.hs = rc, tc, l.tls, hs
	return e
}

// hsConn is the socket under a TLS listener's tls.Conn. While the
// handshake runs it keeps the start of the last read, so that a
// handshake the client ended with a plaintext alert can be named for
// what it is: a TLS 1.3 client that rejects the certificate (OpenSSL's:
// curl, Python) sends its alert unencrypted after the server's encrypted
// flight, and crypto/tls, expecting an encrypted record, reports "bad
// record MAC". After the handshake a read costs one branch more.
type hsConn struct {
	net.Conn
	done bool
	last [64]byte
	n    int
}

func (c *hsConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if !c.done && n > 0 {
		c.n = copy(c.last[:], p[:n])
	}
	return n, err
}

// alert finds a plaintext alert record (content type 21, two bytes) among
// the records the handshake's last read began with, and returns its
// description.
func (c *hsConn) alert() (byte, bool) {
	if c == nil {
		return 0, false
	}
	return plainAlert(c.last[:c.n])
}

// plainAlert walks the TLS records at the start of b for a plaintext
// alert and returns its description.
func plainAlert(b []byte) (byte, bool) {
	for len(b) >= 5 {
		typ, n := b[0], int(b[3])<<8|int(b[4])
		if b[1] != 3 {
			return 0, false // not a TLS record header
		}
		if typ == 21 && n == 2 && len(b) >= 7 {
			return b[6], true
		}
		if len(b) < 5+n {
			return 0, false
		}
		b = b[5+n:]
	}
	return 0, false
}

// alertName names a TLS alert description (RFC 8446 §6).
func alertName(d byte) string {
	switch d {
	case 0:
		return "close_notify"
	case 10:
		return "unexpected_message"
	case 20:
		return "bad_record_mac"
	case 40:
		return "handshake_failure"
	case 42:
		return "bad_certificate"
	case 43:
		return "unsupported_certificate"
	case 44:
		return "certificate_revoked"
	case 45:
		return "certificate_expired"
	case 46:
		return "certificate_unknown"
	case 47:
		return "illegal_parameter"
	case 48:
		return "unknown_ca"
	case 49:
		return "access_denied"
	case 50:
		return "decode_error"
	case 51:
		return "decrypt_error"
	case 70:
		return "protocol_version"
	case 71:
		return "insufficient_security"
	case 80:
		return "internal_error"
	case 90:
		return "user_canceled"
	case 109:
		return "missing_extension"
	case 112:
		return "unrecognized_name"
	case 116:
		return "certificate_required"
	case 120:
		return "no_application_protocol"
	}
	return "alert " + strconv.Itoa(int(d))
}

// ReloadTLS re-reads the listener's certificates if cfg still serves it
// over TLS (a reload). Listener settings otherwise need a restart.
func (l *Listener) ReloadTLS(cfg *config.Config) {
	var nl *config.Listener
	for i := range cfg.Listeners {
		if cfg.Listeners[i].Name == l.cfg.Name {
			nl = &cfg.Listeners[i]
		}
	}
	switch {
	case nl == nil:
	case l.tls != nil && nl.TLS != nil:
		l.tls.reload(*nl.TLS, "reload")
	case (l.tls != nil) != (nl.TLS != nil):
		l.log.Warn().Str("listener", l.cfg.Name).Msg("turning TLS on or off for a listener needs a restart; kept as it was")
	}
}

// Close stops the listener's certificate watcher.
func (l *Listener) Close() {
	if l.tls != nil {
		l.tls.close()
	}
}
