package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// ErrBenchLoad is returned when the load generator could not complete a
// single request.
var ErrBenchLoad = errors.New("bench: load generator failed")

// LoadConfig drives one closed-loop load run: Concurrency connections, each
// sending the next request as soon as the previous response is read.
type LoadConfig struct {
	// Addr is the host:port of the target.
	Addr string
	// Request is the complete HTTP/1.1 request sent over and over on each
	// keep-alive connection.
	Request []byte
	// Concurrency is the number of connections, each with one request in
	// flight.
	Concurrency int
	// Duration of the measured run, in which every worker makes at least
	// one request. Ignored when Requests > 0.
	Duration time.Duration
	// Requests, when > 0, is the total number of measured requests.
	Requests int
	// Warmup runs before the measurement, unrecorded: connections are
	// opened and pools filled.
	Warmup time.Duration
	// OnStart, when set, is called after the warm-up, right before the
	// measurement starts.
	OnStart func()
	// TLS, when set, makes every connection a TLS client with it.
	TLS *tls.Config
}

// Result is what a load run measured.
type Result struct {
	Requests int
	Errors   int
	Elapsed  time.Duration
	// Latencies of the successful requests, sorted.
	Latencies []time.Duration
	// FirstError is the first error seen, for diagnostics.
	FirstError error
	// CPU is the CPU time the whole process (load generator, and whatever
	// else runs in it: sidecar, agents, upstream) used during the run.
	CPU time.Duration
}

// CPUPerRequest is CPU over successful requests: unlike throughput, it
// hardly depends on what else runs on the machine.
func (r Result) CPUPerRequest() time.Duration {
	if r.Requests == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Requests)
}

// RPS is successful requests per second.
func (r Result) RPS() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

// Quantile returns the q-quantile (0..1) of the latencies.
func (r Result) Quantile(q float64) time.Duration {
	if len(r.Latencies) == 0 {
		return 0
	}
	i := int(q * float64(len(r.Latencies)-1))
	return r.Latencies[i]
}

// GetRequest is a keep-alive GET of path.
func GetRequest(host, path string) []byte {
	return fmt.Appendf(nil, "GET %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench\r\n\r\n", path, host)
}

// PostRequest is a keep-alive POST of path with a body of size bytes.
func PostRequest(host, path string, size int) []byte {
	b := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: bench\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: %d\r\n\r\n", path, host, size)
	for i := range size {
		b = append(b, 'a'+byte(i%26))
	}
	return b
}

// RunLoad runs the load described by cfg.
func RunLoad(ctx context.Context, cfg LoadConfig) (Result, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Warmup > 0 {
		w := cfg
		w.Warmup, w.Requests, w.Duration, w.OnStart = 0, 0, cfg.Warmup, nil
		if _, err := RunLoad(ctx, w); err != nil {
			return Result{}, err
		}
	}
	if cfg.OnStart != nil {
		cfg.OnStart()
	}

	var (
		remaining atomic.Int64
		stop      atomic.Bool
	)
	remaining.Store(int64(cfg.Requests))
	take := func() bool {
		if stop.Load() {
			return false
		}
		return cfg.Requests <= 0 || remaining.Add(-1) >= 0
	}

	type workerResult struct {
		lat  []time.Duration
		errs int
		err  error
	}
	results := make([]workerResult, cfg.Concurrency)
	var wg sync.WaitGroup
	cpu0 := processCPU()
	start := time.Now()
	var timer *time.Timer
	if cfg.Requests <= 0 {
		timer = time.AfterFunc(cfg.Duration, func() { stop.Store(true) })
	}
	done := context.AfterFunc(ctx, func() { stop.Store(true) })
	for w := range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := &results[w]
			res.lat = make([]time.Duration, 0, 4096)
			c := loadConn{tls: cfg.TLS}
			defer c.close()
			// In a load bounded by duration every worker makes its first
			// request whenever it starts: on a loaded machine the timer
			// can fire before any worker ran (a short warmup especially),
			// and the load would measure nothing.
			first := cfg.Requests <= 0 && ctx.Err() == nil
			for ; first || take(); first = false {
				t0 := time.Now()
				if err := c.do(cfg.Addr, cfg.Request); err != nil {
					res.errs++
					if res.err == nil {
						res.err = err
					}
					c.close()
					// Do not spin on a dead target.
					time.Sleep(time.Millisecond)
					continue
				}
				res.lat = append(res.lat, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cpu := processCPU() - cpu0
	done()
	if timer != nil {
		timer.Stop()
	}

	var r Result
	r.Elapsed = elapsed
	r.CPU = cpu
	for _, w := range results {
		r.Latencies = append(r.Latencies, w.lat...)
		r.Errors += w.errs
		if r.FirstError == nil {
			r.FirstError = w.err
		}
	}
	r.Requests = len(r.Latencies)
	slices.Sort(r.Latencies)
	if r.Requests == 0 {
		return r, fmt.Errorf("%w: no successful request: %v", ErrBenchLoad, r.FirstError)
	}
	return r, nil
}

// loadConn is one keep-alive client connection.
type loadConn struct {
	nc   net.Conn
	br   *bufio.Reader
	resp fasthttp.Response
	tls  *tls.Config
}

func (c *loadConn) do(addr string, req []byte) error {
	if c.nc == nil {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			return err
		}
		if c.tls != nil {
			nc = tls.Client(nc, c.tls)
		}
		c.nc = nc
		if c.br == nil {
			c.br = bufio.NewReaderSize(nc, 16<<10)
		} else {
			c.br.Reset(nc)
		}
	}
	if _, err := c.nc.Write(req); err != nil {
		return err
	}
	c.resp.Reset()
	if err := c.resp.Read(c.br); err != nil {
		return err
	}
	if sc := c.resp.StatusCode(); sc != fasthttp.StatusOK {
		return fmt.Errorf("status %d: %.200s", sc, c.resp.Body())
	}
	if c.resp.ConnectionClose() {
		c.close()
	}
	return nil
}

func (c *loadConn) close() {
	if c.nc != nil {
		_ = c.nc.Close()
		c.nc = nil
	}
}
