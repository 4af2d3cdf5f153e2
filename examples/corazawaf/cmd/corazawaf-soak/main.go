// Command corazawaf-soak runs many requests through the Coraza agent
// (package corazawaf) in-process, the way the SDK calls it, and prints the
// process's resident memory as it goes: it shows that every Coraza
// transaction is closed, whichever way its request ends.
//
//	go run ./examples/corazawaf/cmd/corazawaf-soak -n 100000 -every 10000
//
// The requests are a mix: 70% benign GETs and 10% form POSTs (body in two
// chunks) through the request and response phases, 10% attacks blocked at
// the request, 5% canceled mid-body, and 5% abandoned after the request
// phase (no response ever comes: the MaxPending bound and the TTL close
// them; -abandon=false completes them instead).
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func main() {
	n := flag.Int("n", 100000, "requests to run")
	every := flag.Int("every", 10000, "print memory every this many `requests`")
	conc := flag.Int("c", 4, "concurrent requests")
	maxPending := flag.Int("max-pending", corazawaf.DefaultMaxPending, "the agent's MaxPending")
	flag.BoolVar(&abandon, "abandon", true, "abandon 5% of the requests after their request phase (false: they complete)")
	flag.Parse()
	if *n < 1 || *every < 1 || *conc < 1 {
		fmt.Fprintln(os.Stderr, "corazawaf-soak: -n, -every and -c must be positive")
		os.Exit(2)
	}
	cfg := corazawaf.DefaultConfig()
	cfg.MaxPending = *maxPending
	cfg.LogRate = 0
	if err := soak(os.Stdout, cfg, *n, *every, *conc); err != nil {
		fmt.Fprintln(os.Stderr, "corazawaf-soak:", err)
		os.Exit(1)
	}
}

// abandon: requests of the abandoned kind get no response headers.
var abandon = true

// errLeak: transactions stayed open after Close.
var errLeak = errors.New("transactions left open")

// soak runs n requests on conc goroutines and prints a memory line every
// `every` requests, then one after Close.
func soak(w io.Writer, cfg corazawaf.Config, n, every, conc int) error {
	h, err := corazawaf.New(cfg, nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%9s %9s %9s %7s %8s %8s %8s\n", "requests", "rss_mib", "heap_mib", "open", "pending", "blocked", "evicted")
	line := func(done int) {
		// Twice: Coraza's pool of closed transactions survives one.
		runtime.GC()
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		s := h.Stats()
		fmt.Fprintf(w, "%9d %9.1f %9.1f %7d %8d %8d %8d\n", done, float64(rss())/(1<<20), float64(ms.HeapInuse)/(1<<20),
			s.Open, h.Pending(), s.Blocked, s.Evicted)
	}
	line(0)
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for {
				i := int(next.Add(1))
				if i > n {
					return
				}
				if err := one(h, uint64(i)); err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("request %d: %w", i, err)
					}
					mu.Unlock()
					return
				}
				if i%every == 0 {
					mu.Lock()
					line(i)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	_ = h.Close()
	fmt.Fprint(w, "after Close:\n")
	line(n)
	if open := h.Stats().Open; open != 0 {
		return fmt.Errorf("%w: %d", errLeak, open)
	}
	return nil
}

var (
	form   = []byte("name=Ada+Lovelace&email=ada%40example.com&country=UK&agree=on")
	hdrs   = protocol.Headers{{Name: []byte("host"), Value: []byte("shop.example")}, {Name: []byte("user-agent"), Value: []byte("curl/8.5.0")}, {Name: []byte("accept"), Value: []byte("*/*")}}
	ctForm = protocol.Header{Name: []byte("content-type"), Value: []byte("application/x-www-form-urlencoded")}
	resp   = protocol.Headers{{Name: []byte("content-type"), Value: []byte("application/json")}}
)

// one runs request id through h; which path it takes depends on id.
func one(h *corazawaf.Handler, id uint64) error {
	ctx := context.Background()
	kind := id % 20
	m := &protocol.RequestHeaders{RequestID: id, Method: []byte("GET"), Headers: hdrs}
	m.Metadata.ClientIP, m.Metadata.Protocol = []byte("10.1.2.3"), []byte("HTTP/1.1")
	switch {
	case kind < 14: // benign GET
		m.URI = []byte("/search?q=shoes&page=" + strconv.FormatUint(id%50, 10))
	case kind < 16: // form POST, two chunks
		m.Method, m.URI, m.HasBody = []byte("POST"), []byte("/signup"), true
		m.Headers = append(hdrs[:len(hdrs):len(hdrs)], ctForm)
	case kind < 18: // attack
		m.URI = []byte("/products?id=1%27%20OR%20%271%27%3D%271")
	case kind == 18: // canceled mid-body
		m.Method, m.URI, m.HasBody = []byte("POST"), []byte("/upload"), true
		m.Headers = append(hdrs[:len(hdrs):len(hdrs)], ctForm)
	default: // abandoned after the request phase
		m.URI = []byte("/slow")
	}
	var d protocol.Decision
	if err := h.OnRequestHeaders(ctx, m, &d); err != nil {
		return err
	}
	switch {
	case kind >= 14 && kind < 16:
		for i, part := range [][]byte{form[:20], form[20:]} {
			var r sdk.BodyReply
			if err := h.OnRequestBody(ctx, &protocol.BodyChunk{RequestID: id, ChunkIndex: uint32(i), Data: part, IsLast: i == 1}, &r); err != nil {
				return err
			}
		}
	case kind == 18:
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		var r sdk.BodyReply
		return h.OnRequestBody(cctx, &protocol.BodyChunk{RequestID: id, Data: form[:10]}, &r)
	case kind >= 16 && kind < 18:
		if d.Kind != protocol.DecisionBlock {
			return fmt.Errorf("attack not blocked: %v", d.Kind)
		}
		return nil
	case kind == 19 && abandon:
		return nil
	}
	var rd protocol.Decision
	return h.OnResponseHeaders(ctx, &protocol.ResponseHeaders{RequestID: id, StatusCode: 200, Headers: resp, HasBody: true}, &rd)
}

// rss is the process's resident set size in bytes (Linux; 0 elsewhere).
func rss() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:")); ok {
			kb, _ := strconv.ParseInt(string(bytes.TrimSuffix(bytes.TrimSpace(v), []byte(" kB"))), 10, 64)
			return kb << 10
		}
	}
	return 0
}
