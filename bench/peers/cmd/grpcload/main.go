// Command grpcload is the load of the peer benchmark's gRPC rows: -c
// connections (one grpc-go ClientConn each), -m unary Echo calls in
// flight on each, of a -size-byte message, for -d. It reports in wrk's
// lines, which the harness reads: the calls completed and the window,
// the 50th and 99th percentiles of their latency, and the failed calls
// as non-2xx responses.
//
//	grpcload -c 64 -m 10 -d 8s 127.0.0.1:8080
//	grpcload -check [-deny] 127.0.0.1:8080   # one allowed call (must succeed); -deny: one denied (must fail)
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/echo"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("grpcload", flag.ContinueOnError)
	fs.SetOutput(stderr)
	conns := fs.Int("c", 64, "`connections`")
	streams := fs.Int("m", 10, "calls in flight on each connection")
	d := fs.Duration("d", 8*time.Second, "load `time`")
	size := fs.Int("size", 64, "message `bytes`")
	check := fs.Bool("check", false, "check instead of loading: one /peers.Echo/Echo call succeeds")
	deny := fs.Bool("deny", false, "with -check: one /admin/Echo call fails too (the proxy's agent denies it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 1 || *conns < 1 || *streams < 1 {
		fmt.Fprintln(stderr, "usage: grpcload [-c N] [-m N] [-d time] [-size N] [-check [-deny]] host:port")
		return 2
	}
	target := fs.Arg(0)
	msg := &wrapperspb.BytesValue{Value: make([]byte, *size)}
	if *check {
		if err := checkJob(target, msg, *deny); err != nil {
			fmt.Fprintln(stderr, "grpcload:", err)
			return 1
		}
		return 0
	}

	ccs := make([]*grpc.ClientConn, *conns)
	for i := range ccs {
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			fmt.Fprintln(stderr, "grpcload:", err)
			return 1
		}
		defer cc.Close()
		cc.Connect()
		ccs[i] = cc
	}
	type worker struct {
		lat    []time.Duration
		failed int64
		first  error // the first failure, for the log
	}
	workers := make([]worker, *conns**streams)
	start := time.Now()
	end := start.Add(*d)
	ctx, cancel := context.WithDeadline(context.Background(), end.Add(5*time.Second))
	defer cancel()
	var wg sync.WaitGroup
	for i := range workers {
		w := &workers[i]
		cc := ccs[i%len(ccs)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			out := new(wrapperspb.BytesValue)
			for {
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				err := cc.Invoke(ctx, echo.Method, msg, out)
				if err != nil {
					if w.failed == 0 {
						w.first = err
					}
					w.failed++
					continue
				}
				w.lat = append(w.lat, time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	var lat []time.Duration
	var failed int64
	byCode := map[codes.Code]int64{}
	var first error
	for _, w := range workers {
		lat = append(lat, w.lat...)
		failed += w.failed
		if w.first != nil {
			byCode[status.Code(w.first)] += w.failed
			if first == nil {
				first = w.first
			}
		}
	}
	slices.Sort(lat)
	at := func(q float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(q*float64(len(lat))))]
	}
	// wrk's lines (bench/peers parseWrk).
	fmt.Fprintf(stdout, "Running %v test @ %s\n  %d connections, %d calls in flight on each\n", *d, target, *conns, *streams)
	fmt.Fprintf(stdout, "  Latency Distribution\n     50%% %.2fus\n     99%% %.2fus\n",
		float64(at(0.50))/1e3, float64(at(0.99))/1e3)
	fmt.Fprintf(stdout, "  %d requests in %.2fs, 0B read\n", len(lat), elapsed.Seconds())
	if failed > 0 {
		fmt.Fprintf(stdout, "  Non-2xx or 3xx responses: %d\n", failed)
		// Which failures (by the code of each caller's first), for the log.
		fmt.Fprintf(stdout, "  failed calls by code: %v; first: %v\n", byCode, first)
	}
	fmt.Fprintf(stdout, "Requests/sec: %.2f\n", float64(len(lat))/elapsed.Seconds())
	return 0
}

// checkJob makes one allowed call (it must succeed) and, with deny, one
// denied call (it must fail) through target.
func checkJob(target string, msg *wrapperspb.BytesValue, deny bool) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out := new(wrapperspb.BytesValue)
	if err := cc.Invoke(ctx, echo.Method, msg, out); err != nil {
		return fmt.Errorf("%s: %w", echo.Method, err)
	}
	if len(out.Value) != len(msg.Value) {
		return fmt.Errorf("%s: %d bytes back, want %d", echo.Method, len(out.Value), len(msg.Value))
	}
	if !deny {
		return nil
	}
	if err := cc.Invoke(ctx, echo.AdminMethod, msg, out); err == nil {
		return fmt.Errorf("%s: succeeded, want it denied", echo.AdminMethod)
	}
	return nil
}
