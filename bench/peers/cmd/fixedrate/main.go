// Command fixedrate is the peer benchmark's load below saturation: GET
// requests at a fixed total rate over keep-alive connections, each
// connection sending one request every connections/rate seconds (the
// connections' schedules staggered) and waiting for its response. Where
// wrk measures what a proxy costs when it is kept busy, this measures what
// it costs at a load it can carry with room to spare, where waking up for
// each request, not serving it, is most of the work.
//
//	fixedrate -c 16 -rate 2000 -d 8s http://127.0.0.1:8080/
//
// It prints its report in the lines of wrk's that the harness reads
// ("N requests in Ts", the 50% and 99% latencies, non-2xx responses and
// socket errors). A request whose turn comes while the one before it on
// the same connection is still out waits for it: a connection never has
// two in flight, so a proxy that falls behind shows as a rate below the
// one asked for. Responses must carry Content-Length (the benchmark's
// upstream's do).
package main

import (
	"bufio"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// maxSamples bounds the latencies kept (8 bytes each).
const maxSamples = 1 << 22

func main() {
	conns := flag.Int("c", 16, "keep-alive `connections`")
	rate := flag.Float64("rate", 2000, "total `requests/s`")
	d := flag.Duration("d", 8*time.Second, "how `long` to send")
	flag.Parse()
	if flag.NArg() != 1 || *conns < 1 || *rate <= 0 || *d <= 0 {
		fmt.Fprintln(os.Stderr, "usage: fixedrate [-c connections] [-rate requests/s] [-d duration] http://host:port/path")
		os.Exit(2)
	}
	u, err := url.Parse(flag.Arg(0))
	if err != nil || u.Scheme != "http" || u.Host == "" {
		fmt.Fprintln(os.Stderr, "fixedrate: want an http:// URL:", flag.Arg(0))
		os.Exit(2)
	}
	path := u.RequestURI()
	req := []byte("GET " + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\n\r\n")
	interval := time.Duration(float64(time.Second) * float64(*conns) / *rate)

	fmt.Printf("Running %v test @ %s\n  %d connections, %.0f requests/s\n", *d, u, *conns, *rate)
	var (
		mu       sync.Mutex
		lat      []time.Duration
		requests int64
		non2xx   int64
		errs     = map[string]int64{}
		wg       sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(*d)
	for i := 0; i < *conns; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var mine []time.Duration
			var n, bad int64
			kind, err := run(u.Host, req, start.Add(interval*time.Duration(i)/time.Duration(*conns)), end, interval, func(l time.Duration, ok bool) {
				n++
				if !ok {
					bad++
				}
				if len(mine) < maxSamples / *conns {
					mine = append(mine, l)
				}
			})
			mu.Lock()
			defer mu.Unlock()
			lat = append(lat, mine...)
			requests += n
			non2xx += bad
			if err != nil {
				errs[kind]++
			}
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(start)
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	fmt.Printf("  Latency Distribution\n     50%%  %.2fus\n     99%%  %.2fus\n", float64(pct(0.50).Nanoseconds())/1e3, float64(pct(0.99).Nanoseconds())/1e3)
	fmt.Printf("  %d requests in %.2fs, 0.00MB read\n", requests, elapsed.Seconds())
	if non2xx > 0 {
		fmt.Printf("  Non-2xx or 3xx responses: %d\n", non2xx)
	}
	if len(errs) > 0 {
		fmt.Printf("  Socket errors: connect %d, read %d, write %d, timeout %d\n", errs["connect"], errs["read"], errs["write"], errs["timeout"])
	}
	fmt.Printf("Requests/sec: %.2f\n", float64(requests)/elapsed.Seconds())
}

// ioTimeout bounds each request's exchange.
const ioTimeout = 10 * time.Second

// run sends on one connection from first, every interval, until end; done
// is called with each response's latency and whether it was 2xx or 3xx.
// It returns the kind of error that ended it early ("connect", "read",
// "write", "timeout"), if one did.
func run(addr string, req []byte, first, end time.Time, interval time.Duration, done func(time.Duration, bool)) (string, error) {
	c, err := net.DialTimeout("tcp", addr, ioTimeout)
	if err != nil {
		return "connect", err
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 16<<10)
	for next := first; next.Before(end); next = next.Add(interval) {
		time.Sleep(time.Until(next))
		t0 := time.Now()
		_ = c.SetDeadline(t0.Add(ioTimeout))
		if _, err := c.Write(req); err != nil {
			return kindOf(err, "write"), err
		}
		status, err := readResponse(br)
		if err != nil {
			return kindOf(err, "read"), err
		}
		done(time.Since(t0), status >= 200 && status < 400)
	}
	return "", nil
}

func kindOf(err error, op string) string {
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return "timeout"
	}
	return op
}

var errNoLength = errors.New("fixedrate: a response without Content-Length")

// readResponse reads one response with a Content-Length body and returns
// its status code.
func readResponse(br *bufio.Reader) (int, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	f := bytes.Fields(line)
	if len(f) < 2 {
		return 0, fmt.Errorf("fixedrate: status line %q", line)
	}
	status, err := strconv.Atoi(string(f[1]))
	if err != nil {
		return 0, fmt.Errorf("fixedrate: status line %q", line)
	}
	length := -1
	for {
		h, err := br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(bytes.TrimSpace(h)) == 0 {
			break
		}
		name, value, ok := bytes.Cut(h, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(name), []byte("Content-Length")) {
			if length, err = strconv.Atoi(string(bytes.TrimSpace(value))); err != nil || length < 0 {
				return 0, fmt.Errorf("fixedrate: Content-Length %q", value)
			}
		}
	}
	if length < 0 {
		return 0, errNoLength
	}
	if _, err := br.Discard(length); err != nil {
		return 0, fmt.Errorf("fixedrate: body: %w", io.ErrUnexpectedEOF)
	}
	return status, nil
}
