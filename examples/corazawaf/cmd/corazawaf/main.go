// Command corazawaf serves the Coraza + OWASP Core Rule Set agent
// (package corazawaf) on a Unix socket until interrupted:
//
//	go run ./examples/corazawaf/cmd/corazawaf -socket /tmp/corazawaf.sock
//
// Point an agent of the sidecar's config at the same socket path, with
// request_body mode buffered so that bodies are inspected.
//
// Two files of SecLang directives complete the flags, in CRS's order:
// -setup-directives is read before the CRS rules, as crs-setup.conf is (a
// SecAction setting tx.* variables: tx.allowed_methods,
// tx.blocking_paranoia_level, …, which wins over the flags; runtime
// exclusions with ctl), -directives after them (configure-time
// exclusions: SecRuleRemoveById, SecRuleUpdateTargetById).
//
// -handlers bounds the rule evaluations that run at once (default: the
// CPUs the process may use). A request beyond waits for a slot, and one
// whose deadline at the proxy passes meanwhile is never evaluated: under
// an overload the CPU goes to requests that can still be answered in
// time.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/examples/corazawaf"
	"github.com/zentinelproxy/sidecar/sdk"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, corazawaf.ErrConfig) || errors.Is(err, errUsage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

var errUsage = errors.New("usage")

// serveMetrics serves the agent's metrics and Go's on addr until closed.
func serveMetrics(addr string, h *corazawaf.Handler, lim *sdk.Limiter) (*http.Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(h.Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if lim != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "corazawaf_events_waiting",
			Help: "Events waiting for a handler slot (-handlers) now.",
		}, func() float64 { return float64(lim.Waiting()) }))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-metrics-address: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Timeout: 10 * time.Second}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, WriteTimeout: 15 * time.Second, IdleTimeout: time.Minute}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

func run(args []string) error {
	cfg := corazawaf.DefaultConfig()
	fs := flag.NewFlagSet("corazawaf", flag.ContinueOnError)
	socket := fs.String("socket", filepath.Join(os.TempDir(), "corazawaf.sock"), "Unix socket `path` to listen on")
	mode := fs.String("mode", string(cfg.Mode), "blocking or detection-only")
	fs.IntVar(&cfg.ParanoiaLevel, "paranoia", cfg.ParanoiaLevel, "CRS paranoia `level`, 1 (fewest false positives) to 4")
	fs.IntVar(&cfg.InboundThreshold, "inbound-threshold", cfg.InboundThreshold, "request anomaly `score` that blocks (a critical match scores 5)")
	fs.IntVar(&cfg.OutboundThreshold, "outbound-threshold", cfg.OutboundThreshold, "response anomaly `score` that blocks")
	methods := fs.String("allowed-methods", strings.Join(cfg.AllowedMethods, " "), "HTTP `methods` CRS lets through (space-separated)")
	ctypes := fs.String("allowed-content-types", "", "request body `types` CRS lets through, space-separated (default: CRS's forms, multipart, XML, JSON)")
	exclude := fs.String("exclude", "", "rule `ids` or ranges to remove, comma-separated (e.g. 920350,942100-942199)")
	exclFile := fs.String("exclusions-file", "", "`file` of rule ids or ranges to remove, one or more a line, # comments")
	fs.IntVar(&cfg.BodyLimit, "body-limit", cfg.BodyLimit, "request body `bytes` inspected; larger bodies get 413 (keep >= the sidecar's request_body limit)")
	fs.BoolVar(&cfg.InspectResponse, "inspect-response", cfg.InspectResponse, "inspect response headers (CRS phases 3 and 4)")
	fs.IntVar(&cfg.MaxPending, "max-pending", cfg.MaxPending, "transactions kept open between a request and its response (the oldest is closed beyond it)")
	fs.DurationVar(&cfg.PendingTTL, "pending-ttl", cfg.PendingTTL, "close a transaction whose next event has not come after this `duration`")
	fs.BoolVar(&cfg.RxPreFilter, "rx-prefilter", cfg.RxPreFilter, "skip a rule's regular expression on inputs that lack the literals any match needs (Coraza's SecRxPreFilter)")
	fs.IntVar(&cfg.LogRate, "log-rate", cfg.LogRate, "request log lines per second at most (0: none)")
	setupFile := fs.String("setup-directives", "", "`file` of SecLang directives read before the CRS rules, like crs-setup.conf (SecAction setting tx.* variables, which wins over the flags; runtime exclusions with ctl)")
	extraFile := fs.String("directives", "", "`file` of SecLang directives read after the CRS rules (SecRuleRemoveById, SecRuleRemoveByTag, SecRuleUpdateTargetById)")
	handlers := fs.Int("handlers", runtime.GOMAXPROCS(0), "rule evaluations that run at once; more wait, and those the proxy gave up on meanwhile are dropped (0: no limit)")
	level := fs.String("log-level", "info", "log `level`: debug, info, warn or error")
	metricsAddr := fs.String("metrics-address", "", "serve Prometheus metrics on this `host:port` at /metrics (empty: off)")
	if err := fs.Parse(args); err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	cfg.Mode = corazawaf.Mode(*mode)
	cfg.AllowedMethods = strings.Fields(*methods)
	cfg.AllowedContentTypes = strings.Fields(*ctypes)
	if *exclude != "" {
		rr, err := corazawaf.ParseExclusions(strings.NewReader(*exclude))
		if err != nil {
			return fmt.Errorf("-exclude: %w", err)
		}
		cfg.Exclusions = append(cfg.Exclusions, rr...)
	}
	if *exclFile != "" {
		rr, err := corazawaf.ParseExclusionsFile(*exclFile)
		if err != nil {
			return err
		}
		cfg.Exclusions = append(cfg.Exclusions, rr...)
	}
	var err error
	if *setupFile != "" {
		if cfg.SetupDirectives, err = corazawaf.ReadDirectivesFile(*setupFile); err != nil {
			return fmt.Errorf("-setup-directives: %w", err)
		}
	}
	if *extraFile != "" {
		if cfg.ExtraDirectives, err = corazawaf.ReadDirectivesFile(*extraFile); err != nil {
			return fmt.Errorf("-directives: %w", err)
		}
	}
	if *handlers < 0 {
		return fmt.Errorf("%w: -handlers %d (want 0 or more)", errUsage, *handlers)
	}
	var lim *sdk.Limiter
	if *handlers > 0 {
		lim = sdk.NewLimiter(*handlers)
	}
	lv, err := zerolog.ParseLevel(*level)
	if err != nil || lv == zerolog.NoLevel {
		return fmt.Errorf("%w: -log-level %q", errUsage, *level)
	}
	log := zerolog.New(os.Stderr).Level(lv).With().Timestamp().Str("agent", "corazawaf").Logger()

	h, err := corazawaf.New(cfg, &log)
	if err != nil {
		return err
	}
	defer h.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *metricsAddr != "" {
		srv, err := serveMetrics(*metricsAddr, h, lim)
		if err != nil {
			return err
		}
		defer srv.Close()
		log.Info().Str("address", *metricsAddr).Msg("metrics")
	}
	log.Info().Str("socket", *socket).Str("mode", string(cfg.Mode)).Int("paranoia", cfg.ParanoiaLevel).
		Int("inbound_threshold", cfg.InboundThreshold).Int("exclusions", len(cfg.Exclusions)).
		Bool("setup_directives", cfg.SetupDirectives != "").Bool("directives", cfg.ExtraDirectives != "").
		Int("handlers", *handlers).Msg("serving")
	if err := sdk.ServeUDS(ctx, *socket, h, &sdk.Options{Name: "corazawaf", Logger: &log, Limiter: lim}); err != nil && ctx.Err() == nil {
		return err
	}
	s := h.Stats()
	ds := sdk.ReadStats()
	log.Info().Uint64("requests", s.Requests).Uint64("blocked", s.Blocked).Uint64("detected", s.Detected).
		Uint64("canceled", s.Canceled).Uint64("timed_out", s.TimedOut).
		Uint64("expired", s.Expired).Uint64("evicted", s.Evicted).
		Uint64("dropped_canceled", ds.DroppedCanceled).Uint64("dropped_deadline", ds.DroppedExpired).Msg("stopped")
	return nil
}
