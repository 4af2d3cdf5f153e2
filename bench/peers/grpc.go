package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// The gRPC rows (rowDef.grpc): unary calls from cmd/grpcload through the
// proxy (h2c) to cmd/grpcupstream (h2c), the job checked with gRPC calls.

// grpcTarget is the host:port of a row's target URL.
func grpcTarget(url string) string {
	return strings.TrimSuffix(strings.TrimPrefix(url, "http://"), "/")
}

// checkGRPCJob is checkJob for a gRPC row: through the proxy, an Echo
// call succeeds and reaches the upstream (with X-Agent-Processed: true in
// its metadata when the row has an agent); with an agent, a call of
// /admin/Echo fails and never reaches it.
func checkGRPCJob(h *harness, rc *rowCtx, withAgent bool) error {
	before, err := getStats(rc.statsAddr())
	if err != nil {
		return fmt.Errorf("upstream stats: %w", err)
	}
	args := []string{h.bin("grpcload"), "-check"}
	if withAgent {
		args = append(args, "-deny")
	}
	p, err := h.procs.start("grpcload-check", h.loadCPUs, filepath.Join(rc.dir, "grpcload-check.log"), nil,
		append(args, grpcTarget(rc.target))...)
	if err != nil {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(startTimeout):
	}
	h.procs.stop(p)
	if p.err != nil {
		return fmt.Errorf("grpcload -check: %v:\n%s", p.err, p.tail())
	}
	after, err := getStats(rc.statsAddr())
	if err != nil {
		return fmt.Errorf("upstream stats: %w", err)
	}
	return after.sawOne(before, "/admin/Echo", "calls", withAgent)
}

// runGRPCLoad runs cmd/grpcload against url for d: -connections
// ClientConns, -h2-streams calls in flight on each, pinned to the load
// CPUs with -threads as its GOMAXPROCS (as wrk's and h2load's threads).
// It reports in wrk's lines.
func (h *harness) runGRPCLoad(dir, name, url string, d time.Duration) (wrkOut, error) {
	logPath := filepath.Join(dir, name+".log")
	p, err := h.procs.start("grpcload", h.loadCPUs, logPath, []string{"GOMAXPROCS=" + strconv.Itoa(h.threads)},
		h.bin("grpcload"), "-c", strconv.Itoa(h.conns), "-m", strconv.Itoa(h.h2Streams), "-d", d.String(), grpcTarget(url))
	if err != nil {
		return wrkOut{}, err
	}
	<-p.done
	h.procs.stop(p)
	if p.err != nil {
		return wrkOut{}, fmt.Errorf("grpcload: %v:\n%s", p.err, p.tail())
	}
	f, err := os.Open(logPath)
	if err != nil {
		return wrkOut{}, err
	}
	defer f.Close()
	o, err := parseWrk(f)
	if st := p.cmd.ProcessState; st != nil {
		o.cpu = st.UserTime() + st.SystemTime()
	}
	return o, err
}
