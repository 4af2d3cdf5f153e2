package http1

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/exchange"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// HTTP/2 on a listener. A connection's protocol is known only once its
// first bytes are in (cleartext: the HTTP/2 connection preface, RFC 9113
// §3.4) or its TLS handshake is done (ALPN), so a listener that serves
// HTTP/2 sorts its connections before fasthttp sees them: accepted
// connections are sorted each in its own goroutine, under the
// listener's read_timeout, and those that speak HTTP/1 are handed to
// fasthttp's Accept; HTTP/2 ones go to the HTTP/2 server and never reach
// fasthttp. A listener that serves HTTP/1 only keeps fasthttp's accept
// loop as it was. The cost is a goroutine and a channel hand-off per
// connection, none per request.

// HTTP2 serves a listener's HTTP/2 connections
// (dataplane/internal/http2).
type HTTP2 interface {
	// ServeConn serves c until it ends and closes it; info are its
	// facts; sawPreface: the connection preface was read from c.
	ServeConn(c net.Conn, info *exchange.Conn, sawPreface bool)
	// Shutdown ends every connection with a GOAWAY, waiting for their
	// streams within ctx.
	Shutdown(ctx context.Context) error
}

// SetHTTP2 makes the listener serve HTTP/2 through h, as its
// configuration's protocols say (h2 over TLS by ALPN, h2c by the
// preface); before Serve.
func (l *Listener) SetHTTP2(h HTTP2) { l.h2 = h }

// Facts is the listener as the exchange knows it.
func (l *Listener) Facts() exchange.Listener { return l.facts }

// preface is the client connection preface of HTTP/2.
const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// sniffListener sorts the connections of a listener that serves HTTP/2.
type sniffListener struct {
	*eofListener
	h2         HTTP2
	http1, h2c bool
	timeout    time.Duration
	facts      *exchange.Listener

	once  sync.Once
	ready chan net.Conn
	done  chan struct{} // closed when the accept loop ended (err)
	err   error
}

func (l *Listener) sniffer(inner *eofListener) *sniffListener {
	return &sniffListener{eofListener: inner, h2: l.h2, http1: l.cfg.Serves(config.ProtoHTTP1),
		h2c: l.cfg.Serves(config.ProtoH2C), timeout: l.cfg.ReadTimeout, facts: &l.facts,
		ready: make(chan net.Conn), done: make(chan struct{})}
}

// Accept returns the next HTTP/1 connection.
func (l *sniffListener) Accept() (net.Conn, error) {
	l.once.Do(func() { go l.loop() })
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.done:
		return nil, l.err
	}
}

func (l *sniffListener) loop() {
	for {
		c, err := l.eofListener.Accept()
		if err != nil {
			l.err = err
			close(l.done)
			return
		}
		go l.sort(c.(*eofConn))
	}
}

// sort reads what tells the connection's protocol and hands it over.
func (l *sniffListener) sort(c *eofConn) {
	_ = c.SetReadDeadline(time.Now().Add(l.timeout))
	if c.tls != nil {
		if err := c.handshake(); err != nil {
			_ = c.Close() // counted and logged by handshake
			return
		}
		if c.tls.ConnectionState().NegotiatedProtocol == "h2" {
			l.h2.ServeConn(tlsEOFConn{c}, c.connInfo(l.facts), false)
			return
		}
		l.http1Conn(c)
		return
	}
	if !l.h2c {
		l.http1Conn(c)
		return
	}
	var buf [len(preface)]byte
	n := 0
	for n < len(buf) {
		k, err := c.Conn.Read(buf[n:])
		n += k
		if string(buf[:n]) != preface[:n] {
			break
		}
		if err != nil {
			if n == 0 && err != io.EOF && isTimeout(err) && c.conns != nil {
				c.conns.idleClosed.Add(1)
			}
			_ = c.Close()
			return
		}
	}
	if n == len(preface) && string(buf[:]) == preface {
		l.h2.ServeConn(c, c.connInfo(l.facts), true)
		return
	}
	// HTTP/1: what was read is read again by fasthttp.
	c.pre = append([]byte(nil), buf[:n]...)
	l.http1Conn(c)
}

// http1Conn hands c to fasthttp, or closes it when the listener does
// not serve HTTP/1 (or no longer accepts).
func (l *sniffListener) http1Conn(c *eofConn) {
	if !l.http1 {
		_ = c.Close()
		return
	}
	select {
	case l.ready <- c:
	case <-l.done:
		_ = c.Close()
	}
}

// tlsEOFConn is a TLS client connection as the HTTP/2 server sees it:
// its ConnectionState lets x/net/http2 check the TLS version and cipher
// suite (RFC 9113 §9.2).
type tlsEOFConn struct{ *eofConn }

func (c tlsEOFConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

var _ net.Conn = tlsEOFConn{}
