package edgetest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// blockedPost sends a chunked POST the agent blocks on its headers: the
// head, then the body in 4 KiB chunks, each a write of its own (as a
// streaming client does), and reads the answer. reset reports that the
// sidecar reset the connection (a write or the read failed with
// ECONNRESET or EPIPE): it did not read what the client sent.
func blockedPost(addr string, body int) (status int, reset bool, err error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, false, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(longWait))
	isReset := func(err error) bool { return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) }
	wrote := make(chan error, 1)
	go func() {
		if _, err := io.WriteString(c, "POST /blocked/upload HTTP/1.1\r\nHost: public.example\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
			wrote <- err
			return
		}
		chunk := []byte(fmt.Sprintf("1000\r\n%s\r\n", strings.Repeat("b", 4096)))
		for sent := 0; sent < body; sent += 4096 {
			if _, err := c.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
		_, err := io.WriteString(c, "0\r\n\r\n")
		wrote <- err
	}()
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		status = resp.StatusCode
	}
	if err == nil {
		// Then the end of the stream: a FIN, not a reset.
		if _, err = br.ReadByte(); err == io.EOF {
			err = nil
		} else if err == nil {
			err = errors.New("bytes after the answer")
		}
	}
	werr := <-wrote
	return status, isReset(err) || isReset(werr), err
}

// streamedBody is a body of unknown length (sent chunked) read in 4 KiB
// pieces.
type streamedBody struct{ r io.Reader }

func (b streamedBody) Read(p []byte) (int, error) { return b.r.Read(p[:min(len(p), 4096)]) }

// TestBlockedPostReadsIts403: a request blocked on its headers is answered
// before its body is read, and the connection closes after the answer.
// Closed at once, the body still arriving makes the kernel reset the
// connection: the client's next write fails, and a client that takes the
// failed write for the request's failure (Go's net/http does) loses the
// 403 it was sent. The lingering close reads and discards the rest
// first. 1,000 chunked POSTs of each size at concurrency 8 through
// net/http: every one reads its 403. Over raw sockets: no reset at all.
func TestBlockedPostReadsIts403(t *testing.T) {
	env := startLifecycle(t, `  - name: edge
    address: 127.0.0.1:0`)
	addr := env.addrs[0]
	// run sends total requests through conc workers; one returns a
	// failure's text ("" for a 403).
	run := func(t *testing.T, total, conc int, one func(worker int) string) (int, map[string]int) {
		var (
			mu   sync.Mutex
			ok   int
			errs = map[string]int{}
			next = make(chan struct{})
			wg   sync.WaitGroup
		)
		for w := 0; w < conc; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					f := one(w)
					mu.Lock()
					if f == "" {
						ok++
					} else {
						errs[f]++
					}
					mu.Unlock()
				}
			}()
		}
		for i := 0; i < total; i++ {
			next <- struct{}{}
		}
		close(next)
		wg.Wait()
		return ok, errs
	}
	lastPart := func(err error) string {
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		return msg
	}
	for _, size := range []int{4 << 10, 64 << 10} {
		t.Run(fmt.Sprintf("net/http, %d KiB", size>>10), func(t *testing.T) {
			const total, conc = 1000, 8
			clients := make([]*http.Client, conc)
			for i := range clients {
				tr := &http.Transport{}
				defer tr.CloseIdleConnections()
				clients[i] = &http.Client{Transport: tr, Timeout: longWait}
			}
			body := strings.Repeat("b", size)
			ok, errs := run(t, total, conc, func(w int) string {
				req, err := http.NewRequest("POST", "http://"+addr+"/blocked/upload", streamedBody{strings.NewReader(body)})
				if err != nil {
					return err.Error()
				}
				resp, err := clients[w].Do(req)
				if err != nil {
					return lastPart(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 403 {
					return fmt.Sprintf("status %d", resp.StatusCode)
				}
				return ""
			})
			t.Logf("%d of %d blocked POSTs read their 403; failures: %v", ok, total, errs)
			if ok != total {
				t.Errorf("%d of %d blocked POSTs lost their 403: %v", total-ok, total, errs)
			}
		})
		t.Run(fmt.Sprintf("raw, %d KiB", size>>10), func(t *testing.T) {
			const total, conc = 200, 8
			ok, errs := run(t, total, conc, func(int) string {
				st, reset, err := blockedPost(addr, size)
				switch {
				case reset:
					return "reset"
				case err != nil:
					return lastPart(err)
				case st != 403:
					return fmt.Sprintf("status %d", st)
				}
				return ""
			})
			t.Logf("%d of %d read their 403 without a reset; failures: %v", ok, total, errs)
			if ok != total {
				t.Errorf("%d of %d blocked POSTs failed: %v", total-ok, total, errs)
			}
		})
	}
	if st := connStats(t, env.sc, "edge"); st["lingering_closes"] == 0 {
		t.Errorf("no lingering close counted: %v", st)
	}
}

// TestLingeringCloseBounded: the lingering close ends at the client's
// end of stream, at max_lingering_bytes or at lingering_timeout, whichever
// comes first, and shutdown does not wait past it.
func TestLingeringCloseBounded(t *testing.T) {
	// A drain longer than the test waits: the process ends when the
	// lingering close does.
	env := startLifecycle(t, `  - name: edge
    address: 127.0.0.1:0
    lingering_timeout: 500ms
    max_lingering_bytes: 256KiB`, "-drain", "10m")
	addr := env.addrs[0]
	// blockedUpload sends the head of a large upload to a blocked path,
	// then the body through feed until a write fails (the sidecar closed
	// the connection), and returns the status it read.
	blockedUpload := func(t *testing.T, feed func(w io.Writer) error) int {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(longWait))
		// The head and the first 8 KiB, which fasthttp reads before the
		// request reaches the agent.
		if _, err := io.WriteString(c, "POST /blocked/big HTTP/1.1\r\nHost: public.example\r\nContent-Length: 1073741824\r\n\r\n"+strings.Repeat("x", 8<<10)); err != nil {
			t.Fatal(err)
		}
		fed := make(chan error, 1)
		go func() { fed <- feed(c) }()
		resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: "POST"})
		if err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		resp.Body.Close()
		select {
		case err := <-fed:
			if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("the sidecar kept reading: %v", err)
			}
		case <-time.After(longWait):
			t.Fatal("the sidecar kept the connection past its lingering bounds")
		}
		return resp.StatusCode
	}
	t.Run("a client that keeps sending is cut at max_lingering_bytes", func(t *testing.T) {
		before := connStats(t, env.sc, "edge")["lingering_capped"]
		st := blockedUpload(t, func(w io.Writer) error {
			buf := make([]byte, 64<<10)
			for sent := 0; sent < 1<<30; sent += len(buf) {
				if _, err := w.Write(buf); err != nil {
					return err
				}
			}
			return nil
		})
		if st != 403 {
			t.Fatalf("status %d, want 403", st)
		}
		testutil.WaitFor(t, "the byte cap counted", func() bool {
			return connStats(t, env.sc, "edge")["lingering_capped"] == before+1
		})
	})
	t.Run("a client that trickles is cut at lingering_timeout", func(t *testing.T) {
		before := connStats(t, env.sc, "edge")["lingering_timeouts"]
		st := blockedUpload(t, func(w io.Writer) error {
			for i := 0; i < 1<<20; i++ {
				if _, err := w.Write([]byte("x")); err != nil {
					return err
				}
				time.Sleep(20 * time.Millisecond)
			}
			return nil
		})
		if st != 403 {
			t.Fatalf("status %d, want 403", st)
		}
		testutil.WaitFor(t, "the timeout counted", func() bool {
			return connStats(t, env.sc, "edge")["lingering_timeouts"] == before+1
		})
	})
	t.Run("shutdown does not wait past lingering_timeout", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(longWait))
		_, _ = io.WriteString(c, "POST /blocked/big HTTP/1.1\r\nHost: public.example\r\nContent-Length: 1048576\r\n\r\n"+strings.Repeat("x", 8<<10))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: "POST"})
		if err != nil || resp.StatusCode != 403 {
			t.Fatalf("answer: %v %v", resp, err)
		}
		_, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		// Lingering now (the client keeps the connection open); the
		// process ends at the lingering bound, not at the client's end
		// nor at the end of the drain.
		if err := env.sc.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-env.sc.exited:
		case <-time.After(longWait):
			t.Fatal("the sidecar did not exit while a connection lingered")
		}
		if err := closedUnanswered(readerConn{c, br}); err != nil {
			t.Fatalf("after exit: %v", err)
		}
	})
}
