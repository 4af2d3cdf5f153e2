package edgetest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// rawUpstream is an HTTP/1.1 server that records every complete request
// it receives, byte for byte, and answers by path:
//
//	/slow?ms=N       after N milliseconds, 200 "slow-ok"
//	/download?kb=N&ms=M  N KiB of 'x' in 64 KiB pieces, spread over M ms
//	/close           200 "bye" with Connection: close, then closes
//	/upgrade         with an Upgrade header: 101, then HTTP again
//	anything else    200 "ok"
type rawUpstream struct {
	ln   net.Listener
	addr string

	mu    sync.Mutex
	reqs  []string
	conns map[net.Conn]bool
	total int // connections accepted
	wg    sync.WaitGroup
}

func startUpstream(t *testing.T) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{ln: ln, addr: ln.Addr().String(), conns: map[net.Conn]bool{}}
	u.serve()
	t.Cleanup(u.stop)
	return u
}

// restart closes the listener and every connection, then listens again on
// the same address: what a restarted upstream looks like to its pool.
func (u *rawUpstream) restart(t *testing.T) {
	t.Helper()
	u.stop()
	var err error
	for i := 0; i < 50; i++ {
		if u.ln, err = net.Listen("tcp", u.addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	u.serve()
}

func (u *rawUpstream) serve() {
	ln := u.ln
	u.wg.Add(1)
	go func() {
		defer u.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u.mu.Lock()
			u.conns[c] = true
			u.total++
			u.mu.Unlock()
			u.wg.Add(1)
			go func() {
				defer u.wg.Done()
				u.handle(c)
				u.mu.Lock()
				delete(u.conns, c)
				u.mu.Unlock()
				_ = c.Close()
			}()
		}
	}()
}

func (u *rawUpstream) stop() {
	_ = u.ln.Close()
	u.mu.Lock()
	for c := range u.conns {
		_ = c.Close()
	}
	u.mu.Unlock()
	u.wg.Wait()
}

// take returns the requests recorded since the last take.
func (u *rawUpstream) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	r := u.reqs
	u.reqs = nil
	return r
}

func (u *rawUpstream) accepted() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.total
}

var errBadRequest = errors.New("upstream: malformed request")

func (u *rawUpstream) handle(c net.Conn) {
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		raw, target, err := readRequest(br)
		if err != nil {
			return
		}
		u.mu.Lock()
		u.reqs = append(u.reqs, raw)
		u.mu.Unlock()
		path, query, _ := strings.Cut(target, "?")
		q := parseQuery(query)
		switch path {
		case "/slow":
			time.Sleep(time.Duration(q["ms"]) * time.Millisecond)
			writeResp(c, "slow-ok", false)
		case "/download":
			size, spread := q["kb"]<<10, time.Duration(q["ms"])*time.Millisecond
			fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", size)
			piece := bytes.Repeat([]byte("x"), 64<<10)
			pieces := (size + len(piece) - 1) / len(piece)
			for sent := 0; sent < size; {
				n := min(len(piece), size-sent)
				if _, err := c.Write(piece[:n]); err != nil {
					return
				}
				sent += n
				if pieces > 1 {
					time.Sleep(spread / time.Duration(pieces))
				}
			}
		case "/close":
			writeResp(c, "bye", true)
			return
		case "/upgrade":
			// A server that switches to any protocol asked for and then
			// reads HTTP requests again: what an h2c server does, in
			// HTTP/1 so that the requests are recorded.
			if up := headerValue(raw, "upgrade"); up != "" {
				fmt.Fprintf(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: %s\r\n\r\n", up)
				continue
			}
			writeResp(c, "ok", false)
		default:
			writeResp(c, "ok", false)
		}
	}
}

func writeResp(c net.Conn, body string, closeConn bool) {
	extra := ""
	if closeConn {
		extra = "Connection: close\r\n"
	}
	fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s", len(body), extra, body)
}

func parseQuery(q string) map[string]int {
	m := map[string]int{}
	for _, kv := range strings.Split(q, "&") {
		k, v, _ := strings.Cut(kv, "=")
		n, _ := strconv.Atoi(v)
		m[k] = n
	}
	return m
}

// readRequest reads one request (head and body, framed by Content-Length
// or chunked) and returns its exact bytes and its target.
func readRequest(br *bufio.Reader) (raw, target string, err error) {
	var b strings.Builder
	cl, chunked := 0, false
	for first := true; ; first = false {
		line, err := br.ReadString('\n')
		if err != nil {
			return "", "", err
		}
		b.WriteString(line)
		if b.Len() > 1<<20 {
			return "", "", errBadRequest
		}
		l := strings.TrimRight(line, "\r\n")
		if first {
			parts := strings.Split(l, " ")
			if len(parts) != 3 {
				return "", "", errBadRequest
			}
			target = parts[1]
			continue
		}
		if l == "" {
			break
		}
		name, value, _ := strings.Cut(l, ":")
		value = strings.TrimSpace(value)
		switch strings.ToLower(name) {
		case "content-length":
			if cl, err = strconv.Atoi(value); err != nil {
				return "", "", errBadRequest
			}
		case "transfer-encoding":
			chunked = strings.EqualFold(value, "chunked")
		}
	}
	if chunked {
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return "", "", err
			}
			b.WriteString(line)
			size, err := strconv.ParseInt(strings.TrimRight(line, "\r\n"), 16, 32)
			if err != nil {
				return "", "", errBadRequest
			}
			data := make([]byte, size+2)
			if _, err := io.ReadFull(br, data); err != nil {
				return "", "", err
			}
			b.Write(data)
			if size == 0 {
				break
			}
		}
	} else if cl > 0 {
		data := make([]byte, cl)
		if _, err := io.ReadFull(br, data); err != nil {
			return "", "", err
		}
		b.Write(data)
	}
	return b.String(), target, nil
}

// headerValue is the value of the first header called name in a raw
// request ("" when none).
func headerValue(raw, name string) string {
	head, _, _ := strings.Cut(raw, "\r\n\r\n")
	for _, l := range strings.Split(head, "\r\n")[1:] {
		if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}
