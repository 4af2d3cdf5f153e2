// Command grpcupstream is the upstream of the peer benchmark's gRPC rows:
// a grpc-go server (cleartext HTTP/2) whose unary Echo answers the message
// it got, and counts what reached it, so that the harness can check that
// an agent's header arrived.
//
//	grpcupstream -addr 127.0.0.1:9000 -stats 127.0.0.1:9001
//
// GET /__peers/stats on -stats answers "total=N marked=M admin=A", as
// cmd/upstream does: calls seen, those whose metadata carried
// x-agent-processed: true, and those of /admin/Echo.
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/zentinelproxy/sidecar/bench/peers/internal/echo"
	"github.com/zentinelproxy/sidecar/bench/peers/internal/job"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:9000", "TCP `address` of the gRPC server")
	statsAddr := flag.String("stats", "127.0.0.1:9001", "TCP `address` of the HTTP/1.1 stats endpoint")
	flag.Parse()

	var total, marked, admin atomic.Int64
	s := grpc.NewServer()
	echo.Register(s, func(ctx context.Context, _ *wrapperspb.BytesValue, isAdmin bool) {
		total.Add(1)
		if md, ok := metadata.FromIncomingContext(ctx); ok {
			if v := md.Get(job.Header); len(v) == 1 && v[0] == job.Value {
				marked.Add(1)
			}
		}
		if isAdmin {
			admin.Add(1)
		}
	})
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcupstream:", err)
		os.Exit(1)
	}
	sln, err := net.Listen("tcp", *statsAddr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpcupstream:", err)
		os.Exit(1)
	}
	go func() {
		_ = http.Serve(sln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "total=%d marked=%d admin=%d\n", total.Load(), marked.Load(), admin.Load())
		}))
	}()
	go func() {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt, syscall.SIGTERM)
		<-c
		os.Exit(0)
	}()
	if err := s.Serve(ln); err != nil {
		fmt.Fprintln(os.Stderr, "grpcupstream:", err)
		os.Exit(1)
	}
}
