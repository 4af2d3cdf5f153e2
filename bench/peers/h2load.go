package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// runH2load runs h2load against url for d over h2c with prior knowledge
// (-connections connections, -h2-streams concurrent streams on each),
// pinned to the load CPUs. Its per-request log gives the percentiles,
// which its report does not.
func (h *harness) runH2load(dir, name, url string, d time.Duration) (wrkOut, error) {
	secs := int((d + time.Second - 1) / time.Second)
	logPath := filepath.Join(dir, name+".log")
	reqLog := filepath.Join(dir, name+"-requests.tsv")
	p, err := h.procs.start("h2load", h.loadCPUs, logPath, nil, h.tools["h2load"],
		"-t", strconv.Itoa(min(h.threads, h.conns)), "-c", strconv.Itoa(h.conns),
		"-m", strconv.Itoa(h.h2Streams), "-D", strconv.Itoa(secs),
		"--log-file", reqLog, url)
	if err != nil {
		return wrkOut{}, err
	}
	<-p.done
	h.procs.stop(p)
	if p.err != nil {
		return wrkOut{}, fmt.Errorf("h2load: %v:\n%s", p.err, p.tail())
	}
	f, err := os.Open(logPath)
	if err != nil {
		return wrkOut{}, err
	}
	defer f.Close()
	o, err := parseH2load(f)
	if err != nil {
		return o, fmt.Errorf("%w:\n%s", err, p.tail())
	}
	if st := p.cmd.ProcessState; st != nil {
		o.cpu = st.UserTime() + st.SystemTime()
	}
	if o.requests == 0 {
		return o, nil // a warm-up may end before its first answer
	}
	lf, err := os.Open(reqLog)
	if err != nil {
		return o, err
	}
	defer func() {
		lf.Close()
		os.Remove(reqLog) // one line per request: large, and read
	}()
	o.p50, o.p99, err = h2loadPercentiles(lf)
	return o, err
}

// parseH2load reads h2load's report: the window and the requests done
// in it, and as failures those not answered 2xx/3xx (h2load's "failed",
// which counts the errored and timed-out ones).
func parseH2load(r io.Reader) (wrkOut, error) {
	var o wrkOut
	var haveFinished, haveRequests bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(l, "finished in "):
			// finished in 4.00s, 23456.25 req/s, 1.23MB/s
			f := strings.Fields(strings.TrimPrefix(l, "finished in "))
			if len(f) == 0 {
				return o, fmt.Errorf("h2load: %q", l)
			}
			d, err := wrkDuration(strings.TrimSuffix(f[0], ","))
			if err != nil {
				return o, fmt.Errorf("h2load: %q: %w", l, err)
			}
			o.elapsed, haveFinished = d, true
		case strings.HasPrefix(l, "requests: "):
			// requests: 93826 total, 93836 started, 93826 done, 93826 succeeded, 0 failed, 0 errored, 0 timeout
			for _, part := range strings.Split(strings.TrimPrefix(l, "requests: "), ",") {
				f := strings.Fields(part)
				if len(f) != 2 {
					continue
				}
				n, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return o, fmt.Errorf("h2load: %q: %w", l, err)
				}
				switch f[1] {
				case "done":
					o.requests, haveRequests = n, true
				case "failed":
					o.failures = n
				}
			}
		}
	}
	if !haveFinished || !haveRequests || o.elapsed <= 0 {
		return o, errors.New("h2load: no \"finished in\" and \"requests:\" lines in its report")
	}
	return o, nil
}

// h2loadPercentiles reads h2load's --log-file (per request: start time
// µs, status, µs to the end of the response, tab-separated) and returns
// the 50th and 99th percentiles of the last column.
func h2loadPercentiles(r io.Reader) (p50, p99 time.Duration, err error) {
	var us []int64
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Split(sc.Text(), "\t")
		if len(f) < 3 {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(f[2]), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("h2load log: %q: %w", sc.Text(), err)
		}
		us = append(us, n)
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	if len(us) == 0 {
		return 0, 0, errors.New("h2load log: no request")
	}
	slices.Sort(us)
	at := func(q float64) time.Duration {
		return time.Duration(us[min(len(us)-1, int(q*float64(len(us))))]) * time.Microsecond
	}
	return at(0.50), at(0.99), nil
}
