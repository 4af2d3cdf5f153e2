package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The demo's built-in upstream: it stands in for the service behind the
// sidecar. Every path echoes the request it received as JSON (so the
// headers the agent added are visible), except /page, an HTML page that
// mentions the word the demo agent redacts.

// echoReply is the JSON the upstream answers with.
type echoReply struct {
	Service    string              `json:"service"`
	Method     string              `json:"method"`
	URI        string              `json:"uri"`
	Host       string              `json:"host"`
	Proto      string              `json:"proto"`
	RemoteAddr string              `json:"remote_addr"`
	Headers    map[string][]string `json:"headers"`
	BodyBytes  int64               `json:"body_bytes"`
}

// maxEchoBody bounds how much of a request body the upstream reads.
const maxEchoBody = 8 << 20

// maxPageRepeat bounds /page?repeat=N.
const maxPageRepeat = 10000

func upstreamHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/page", servePage)
	mux.HandleFunc("/", serveEcho)
	return mux
}

func serveEcho(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, io.LimitReader(r.Body, maxEchoBody))
	rep := echoReply{
		Service:    "demo-upstream",
		Method:     r.Method,
		URI:        r.RequestURI,
		Host:       r.Host,
		Proto:      r.Proto,
		RemoteAddr: r.RemoteAddr,
		Headers:    make(map[string][]string, len(r.Header)),
		BodyBytes:  n,
	}
	for k, v := range r.Header {
		rep.Headers[strings.ToLower(k)] = v
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}

const pageHead = `<!doctype html>
<html><head><title>demo page</title></head>
<body>
<h1>Account overview</h1>
<p>The launch code is a secret. Our Secret sauce stays SECRET.</p>
`

// servePage writes the page in pieces that cut the word in two ("sec" |
// "ret"), flushing after each, so that the redaction is seen working across
// body chunks. ?repeat=N adds N more lines.
func servePage(w http.ResponseWriter, r *http.Request) {
	repeat, _ := strconv.Atoi(r.URL.Query().Get("repeat"))
	repeat = min(max(repeat, 0), maxPageRepeat)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	f, _ := w.(http.Flusher)
	write := func(s string) {
		_, _ = io.WriteString(w, s)
		if f != nil {
			f.Flush()
		}
	}
	write(pageHead)
	for i := range repeat {
		write(fmt.Sprintf("<p>line %d: not a sec", i))
		write("ret any more</p>\n")
	}
	write("</body></html>\n")
}

// startUpstream serves the demo upstream on addr ("127.0.0.1:0" picks a
// port) until ctx ends.
func startUpstream(ctx context.Context, addr string) (net.Addr, <-chan error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("demo upstream: %w", err)
	}
	srv := &http.Server{
		Handler:           upstreamHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       time.Minute,
	}
	done := make(chan error, 1)
	go func() {
		err := srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		done <- err
	}()
	context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	return ln.Addr(), done, nil
}
