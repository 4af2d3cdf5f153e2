package dataplane_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// holdingUpstream accepts one connection, reads the request head, writes
// answer, and then neither reads nor closes the connection until release
// is closed (or hangGuard passes): an upstream that answered early and
// stopped reading, with its socket still open. Then it reads what is
// left and sends how that ended on drained.
func holdingUpstream(t *testing.T, answer string) (addr string, release chan struct{}, drained chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release, drained = make(chan struct{}), make(chan error, 1)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		ln.Close()
		select {
		case <-release:
		default:
			close(release)
		}
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		c, err := ln.Accept()
		if err != nil {
			drained <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(3 * hangGuard))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				drained <- err
				return
			}
			if line == "\r\n" {
				break
			}
		}
		if _, err := io.WriteString(c, answer); err != nil {
			drained <- err
			return
		}
		select {
		case <-release:
		case <-time.After(2 * hangGuard):
		}
		c.SetReadDeadline(time.Now().Add(hangGuard))
		_, err = io.Copy(io.Discard, br)
		drained <- err
	}()
	return ln.Addr().String(), release, drained
}

// sendEndless writes a POST with a 1 GiB body (chunked, or with its
// Content-Length) to c until a write fails; done is closed then.
func sendEndless(c net.Conn, chunked bool) (done chan struct{}) {
	done = make(chan struct{})
	go func() {
		defer close(done)
		const size = 1 << 30
		bw := bufio.NewWriterSize(c, 64<<10)
		if chunked {
			fmt.Fprintf(bw, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
		} else {
			fmt.Fprintf(bw, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n", size)
		}
		piece := make([]byte, 32<<10)
		(&pattern{}).Read(piece)
		for sent := 0; sent < size; sent += len(piece) {
			if chunked {
				fmt.Fprintf(bw, "%x\r\n", len(piece))
			}
			bw.Write(piece)
			if chunked {
				bw.WriteString("\r\n")
			}
			if bw.Flush() != nil {
				return
			}
		}
		if chunked {
			bw.WriteString("0\r\n\r\n")
		}
		bw.Flush()
	}()
	return done
}

// A net/http upstream that answers without reading the request body: it
// reads at most 256 KiB of it, closes its side for writing, and closes
// the connection 500 ms later, resetting it (the body is still coming).
// Its answer reaches the client. (The upstream of setup reads every body
// before its handler runs, so it cannot answer early; and the client here
// is a plain connection, which reads the answer whatever happens to the
// rest of its body, where net/http's client may report the failed write
// instead.)
func TestUpstreamAnswersEarly(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		w.WriteHeader(413)
		w.Write([]byte("too big for me"))
	}))
	t.Cleanup(up.Close)
	p := startProxy(t, configText(t, oneAgentConfig, map[string]any{"Upstream": up.Listener.Addr().String(), "Chain": ""}), nil, nil)
	c, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	done := sendEndless(c, true)
	defer func() { c.Close(); <-done }()
	c.SetReadDeadline(time.Now().Add(hangGuard))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != 413 || string(body) != "too big for me" || err != nil {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, err)
	}
}

// An upstream that answers before it has read the request body and then
// stops reading, without closing: its complete answer reaches the client
// while the body is still being sent and the upstream still holds its
// connection open, not when the upstream closes it or the write times
// out (idle_timeout, 60 s here); the upstream connection is then closed,
// not reused.
func TestUpstreamAnswersEarlyAndHolds(t *testing.T) {
	for _, chunked := range []bool{true, false} {
		t.Run("chunked="+strconv.FormatBool(chunked), func(t *testing.T) {
			addr, release, drained := holdingUpstream(t,
				"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 14\r\nConnection: close\r\n\r\ntoo big for me")
			p := startProxy(t, configText(t, oneAgentConfig, map[string]any{"Upstream": addr, "Chain": ""}), nil, nil)
			c, err := net.Dial("tcp", p.addr)
			if err != nil {
				t.Fatal(err)
			}
			done := sendEndless(c, chunked)
			defer func() { c.Close(); <-done }()
			c.SetReadDeadline(time.Now().Add(hangGuard))
			cr := bufio.NewReader(c)
			resp, err := http.ReadResponse(cr, nil)
			if err != nil {
				t.Fatalf("no answer while the upstream held its connection open: %v", err)
			}
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != 413 || string(body) != "too big for me" || err != nil {
				t.Fatalf("got %d %q %v", resp.StatusCode, body, err)
			}
			// The rest of the client's body is not taken as a request:
			// the proxy closes the client's connection.
			if n, err := io.Copy(io.Discard, cr); n > 0 || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("after the answer: %d more bytes, %v", n, err)
			}
			// Only now may the upstream go on: the proxy has closed its
			// connection (the rest of the request is not sent on it).
			close(release)
			select {
			case err := <-drained:
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("the proxy kept the upstream connection open: %v", err)
				}
				if err != nil && !errors.Is(err, syscall.ECONNRESET) {
					t.Fatalf("upstream read: %v", err)
				}
			case <-time.After(2 * hangGuard):
				t.Fatal("upstream connection not closed")
			}
			if st := p.srv.Stats(); st.UpstreamErrors != 0 {
				t.Fatalf("upstream errors %d", st.UpstreamErrors)
			}
		})
	}
}

// An upstream that sends its head before it reads the body and then
// streams its answer is not cut short: the body is sent whole, even when
// the upstream lets the proxy's writes wait meanwhile.
func TestUpstreamStreamsAnswerWhileReading(t *testing.T) {
	const size = 8 << 20
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan int64, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- -1
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(hangGuard))
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				got <- -1
				return
			}
			if line == "\r\n" {
				break
			}
		}
		c.(*net.TCPConn).SetReadBuffer(64 << 10) // the proxy's writes fill it sooner
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		// Not reading for a while lets the proxy's writes fill the
		// socket and wait with the head already there.
		time.Sleep(200 * time.Millisecond)
		n, _ := io.Copy(io.Discard, io.LimitReader(br, size))
		fmt.Fprintf(c, "%x\r\n;%d\r\n0\r\n\r\n", len(strconv.FormatInt(n, 10))+1, n)
		got <- n
	}()
	p := startProxy(t, configText(t, oneAgentConfig, map[string]any{"Upstream": ln.Addr().String(), "Chain": ""}), nil, nil)
	piece := make([]byte, 32<<10)
	(&pattern{}).Read(piece)
	req, _ := http.NewRequest("POST", p.url("/"), io.LimitReader(repeatReader(piece), size))
	req.ContentLength = size
	resp, err := p.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || string(body) != "hello;"+strconv.Itoa(size) {
		t.Fatalf("got %d %q %v", resp.StatusCode, body, err)
	}
	if n := <-got; n != size {
		t.Fatalf("upstream read %d of %d bytes", n, size)
	}
}

// TestAllocsProxiedPost is the allocation gate of a request with a body
// and no agent: a body that fits in one write to the upstream, and one
// that takes several (the writes that look for an early answer when the
// socket is full).
func TestAllocsProxiedPost(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, size := range []int{1 << 10, 256 << 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) {
			p := startProxy(t, configText(t, oneAgentConfig, map[string]any{"Upstream": fastUpstream(t), "Chain": ""}), nil, nil)
			req := fasthttp.AcquireRequest()
			req.SetRequestURI("http://x/alloc")
			req.Header.SetMethod("POST")
			req.SetBody(make([]byte, size))
			do := steadyRequest(t, p.addr, req)
			n := testing.AllocsPerRun(200, do)
			t.Logf("%.2f allocations per request", n)
			if n > 0 {
				t.Errorf("%.2f allocations per proxied POST of %d bytes, want 0", n, size)
			}
		})
	}
}

// BenchmarkProxyNoAgentPost1K and BenchmarkProxyNoAgentPost256K send a
// request body without an agent: one write to the upstream, and several.
func BenchmarkProxyNoAgentPost1K(b *testing.B)   { benchProxy(b, false, make([]byte, 1<<10)) }
func BenchmarkProxyNoAgentPost256K(b *testing.B) { benchProxy(b, false, make([]byte, 256<<10)) }

// repeatReader reads b over and over.
type repeatReader []byte

func (r repeatReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		n += copy(p[n:], r)
	}
	return n, nil
}
