package agentcheck

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
)

// SoakReport is what a soak measured.
type SoakReport struct {
	Requests  int64         `json:"requests"`
	Decisions int64         `json:"decisions"`
	Errors    int64         `json:"errors"`
	Duration  time.Duration `json:"duration_ns"`
	// DecisionsPerSec counts every reply (Decision or BodyMutation).
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	// P50, P99 and Max are per-event round trips.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// RSS are the samples of the agent's resident memory (with -pid).
	RSS []RSSSample `json:"rss,omitempty"`
	// RSSGrowthPercent compares the last quarter of the samples with the
	// first (after warm-up).
	RSSGrowthPercent float64 `json:"rss_growth_percent,omitempty"`
	RSSGrowthBytes   int64   `json:"rss_growth_bytes,omitempty"`
	FirstError       string  `json:"first_error,omitempty"`
}

// RSSSample is the agent's RSS at some point of the soak.
type RSSSample struct {
	At    time.Duration `json:"at_ns"`
	Bytes int64         `json:"bytes"`
}

// maxSoakErrors ends a soak whose requests keep failing.
const maxSoakErrors = 50

// dispatcher routes the replies of one link to the requests waiting.
type dispatcher struct {
	l    link
	mu   sync.Mutex
	wait map[uint64]chan *reply
	err  error
	done chan struct{}
}

func newDispatcher(l link) *dispatcher {
	d := &dispatcher{l: l, wait: map[uint64]chan *reply{}, done: make(chan struct{})}
	go d.loop()
	return d
}

func (d *dispatcher) loop() {
	defer close(d.done)
	for {
		r, err := d.l.Recv(time.Hour)
		if errors.Is(err, ErrTimeout) {
			continue
		}
		if err != nil {
			d.mu.Lock()
			d.err = err
			d.mu.Unlock()
			return
		}
		d.mu.Lock()
		ch := d.wait[r.ID]
		delete(d.wait, r.ID)
		d.mu.Unlock()
		if ch != nil {
			ch <- r
		}
	}
}

// roundTrip sends m and waits for the reply to id.
func (d *dispatcher) roundTrip(m protocol.Message, id uint64, timeout time.Duration) (*reply, error) {
	ch := make(chan *reply, 1)
	d.mu.Lock()
	if d.err != nil {
		d.mu.Unlock()
		return nil, d.err
	}
	d.wait[id] = ch
	d.mu.Unlock()
	if _, err := d.l.Send(m); err != nil {
		return nil, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case r := <-ch:
		return r, r.Err
	case <-d.done:
		return nil, d.err
	case <-t.C:
		d.mu.Lock()
		delete(d.wait, id)
		d.mu.Unlock()
		return nil, fmt.Errorf("%w (%v) for request %d", ErrTimeout, timeout, id)
	}
}

// flow runs one request through every phase the agent declares, the way
// the proxy does, recording each event's round trip.
func flow(d *dispatcher, c protocol.Capabilities, i int, timeout time.Duration, lat func(time.Duration)) (int, error) {
	id := nextID()
	n := 0
	rt := func(m protocol.Message) (*reply, error) {
		start := time.Now()
		r, err := d.roundTrip(m, id, timeout)
		if err == nil {
			lat(time.Since(start))
			n++
		}
		return r, err
	}
	paths := []string{"/", "/api/items?id=7", "/static/app.js", "/admin/settings", "/search?q=hello", "/old/page"}
	withBody := i%3 == 1
	if c.HandlesRequestHeaders {
		r, err := rt(reqHeaders(id, map[bool]string{true: "POST", false: "GET"}[withBody], paths[i%len(paths)], withBody))
		if err != nil {
			return n, err
		}
		if r.Dec == nil || !(r.Dec.Kind == protocol.DecisionAllow || r.Dec.Kind == protocol.DecisionNeedsMore) {
			return n, nil
		}
	}
	body := func(phase protocol.Phase) (bool, error) {
		for k := 0; k < 3; k++ {
			last := k == 2
			data := []byte(fmt.Sprintf("chunk %d of request %d: some text to look at ", k, id))
			var m protocol.Message = reqChunk(id, uint32(k), data, last)
			if phase == protocol.PhaseResponse {
				m = respChunk(id, uint32(k), data, last)
			}
			r, err := rt(m)
			if err != nil {
				return false, err
			}
			if r.Type == protocol.TypeDecision && r.Dec.Final() {
				return r.Dec.Kind == protocol.DecisionAllow, nil
			}
		}
		return true, nil
	}
	if withBody && c.HandlesRequestBody {
		if ok, err := body(protocol.PhaseRequest); err != nil || !ok {
			return n, err
		}
	}
	if i%2 == 0 {
		if c.HandlesResponseHeaders {
			r, err := rt(respHeaders(id))
			if err != nil {
				return n, err
			}
			if r.Dec == nil || r.Dec.Kind != protocol.DecisionAllow && r.Dec.Kind != protocol.DecisionNeedsMore {
				return n, nil
			}
		}
		if c.HandlesResponseBody {
			if _, err := body(protocol.PhaseResponse); err != nil {
				return n, err
			}
		}
	}
	return n, nil
}

// percentile of sorted durations.
func percentile(s []time.Duration, p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	i := int(float64(len(s)-1) * p)
	return s[i]
}

func (e *env) runSoak() {
	r := Result{ID: "soak", Title: "steady load", Status: Pass, Rule: "docs/protocol.md §7.6 In-flight limit, §7.8 (bound per-request state)"}
	start := time.Now()
	defer func() {
		r.Elapsed = time.Since(start)
		e.strays.judge(&r)
		e.report.Results = append(e.report.Results, r)
	}()
	l, err := e.open()
	if err != nil {
		worse(&r, Fail, "cannot set up a connection: %v", err)
		return
	}
	defer e.release(l, true)
	c := l.Caps()
	if firstEvent(c, 1, "/") == nil {
		r.Status, r.Detail = Skip, "the agent handles no event"
		return
	}
	workers := limitOf(c, e.cfg.Concurrency)
	d := newDispatcher(l)
	rep := &SoakReport{}
	e.report.Soak = rep

	var (
		mu       sync.Mutex
		lats     []time.Duration
		started  atomic.Int64
		firstErr atomic.Value
	)
	stopAt := time.Time{}
	if e.cfg.Soak > 0 {
		stopAt = start.Add(e.cfg.Soak)
	}
	var decisions, errs, reqs atomic.Int64
	more := func() (int, bool) {
		// A broken agent ends the soak early rather than making every
		// remaining request wait for its timeout.
		if e.ctx.Err() != nil || errs.Load() >= maxSoakErrors {
			return 0, false
		}
		if !stopAt.IsZero() && time.Now().After(stopAt) {
			return 0, false
		}
		n := started.Add(1)
		if e.cfg.Requests > 0 && n > int64(e.cfg.Requests) {
			return 0, false
		}
		return int(n), true
	}

	// RSS sampler.
	interval := e.cfg.RSSInterval
	if interval <= 0 {
		interval = time.Second
		if e.cfg.Soak > 0 {
			interval = min(interval, e.cfg.Soak/10)
		} else {
			interval = 20 * time.Millisecond
		}
		interval = max(interval, 10*time.Millisecond)
	}
	stopSampler := make(chan struct{})
	samplerDone := make(chan struct{})
	go func() {
		defer close(samplerDone)
		if e.cfg.PID <= 0 {
			return
		}
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if b, err := procRSS(e.cfg.PID); err == nil {
				rep.RSS = append(rep.RSS, RSSSample{At: time.Since(start), Bytes: b})
			}
			select {
			case <-t.C:
			case <-stopSampler:
				if b, err := procRSS(e.cfg.PID); err == nil {
					rep.RSS = append(rep.RSS, RSSSample{At: time.Since(start), Bytes: b})
				}
				return
			}
		}
	}()

	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, 1024)
			for {
				i, ok := more()
				if !ok {
					break
				}
				n, err := flow(d, c, i, e.cfg.Timeout, func(x time.Duration) { local = append(local, x) })
				decisions.Add(int64(n))
				reqs.Add(1)
				if err != nil {
					errs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					if errors.Is(err, ErrClosed) {
						break
					}
				}
			}
			mu.Lock()
			lats = append(lats, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	close(stopSampler)
	<-samplerDone
	rep.Duration = time.Since(start)
	rep.Requests, rep.Decisions, rep.Errors = reqs.Load(), decisions.Load(), errs.Load()
	if v, ok := firstErr.Load().(string); ok {
		rep.FirstError = v
	}
	slices.Sort(lats)
	rep.P50, rep.P99 = percentile(lats, 0.5), percentile(lats, 0.99)
	if len(lats) > 0 {
		rep.Max = lats[len(lats)-1]
	}
	if s := rep.Duration.Seconds(); s > 0 {
		rep.DecisionsPerSec = float64(rep.Decisions) / s
	}
	note(&r, "%d requests, %d decisions in %v: %.0f decisions/s, p50 %v, p99 %v, max %v, %d in flight",
		rep.Requests, rep.Decisions, rep.Duration.Round(time.Millisecond), rep.DecisionsPerSec,
		rep.P50.Round(time.Microsecond), rep.P99.Round(time.Microsecond), rep.Max.Round(time.Microsecond), workers)
	if rep.Errors > 0 {
		worse(&r, Fail, "%d requests failed, the first: %s", rep.Errors, rep.FirstError)
	}
	e.judgeRSS(&r, rep)
}

// judgeRSS flags memory growth over the soak as a leak.
func (e *env) judgeRSS(r *Result, rep *SoakReport) {
	if e.cfg.PID <= 0 {
		note(r, "no -pid: memory not watched")
		return
	}
	n := len(rep.RSS)
	if n < 4 {
		worse(r, Warn, "only %d RSS samples: soak longer to judge memory", n)
		return
	}
	q := n / 4
	avg := func(s []RSSSample) int64 {
		var t int64
		for _, x := range s {
			t += x.Bytes
		}
		return t / int64(len(s))
	}
	first, last := avg(rep.RSS[:q]), avg(rep.RSS[n-q:])
	rep.RSSGrowthBytes = last - first
	if first > 0 {
		rep.RSSGrowthPercent = 100 * float64(last-first) / float64(first)
	}
	msg := fmt.Sprintf("RSS %.1f MiB → %.1f MiB (%+.0f%%, %d samples)", mib(first), mib(last), rep.RSSGrowthPercent, n)
	switch {
	case rep.RSSGrowthBytes >= e.cfg.LeakMinBytes && rep.RSSGrowthPercent >= e.cfg.LeakFailPercent:
		worse(r, Fail, "%s: memory grows with the requests served, a leak (per-request state not dropped, §7.3, §7.8)", msg)
	case rep.RSSGrowthBytes >= e.cfg.LeakMinBytes && rep.RSSGrowthPercent >= e.cfg.LeakWarnPercent:
		worse(r, Warn, "%s: memory grows during the soak", msg)
	default:
		note(r, "%s", msg)
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
