package supervisor

import (
	"fmt"
	"io"
	"strings"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// Load reads the configuration file, applies override (if any) and
// validates the result completely, the transports' options and the
// files and directories a start opens (Preflight) included: what Load
// accepts, a start does not refuse for its content. An error for a bad
// file wraps config.ErrConfigSyntax or config.ErrConfigInvalid and names
// the line; one for a file that cannot be read wraps
// config.ErrConfigUnreadable. check-config, run and every reload load
// through it.
func Load(path string, override func(*config.Config)) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	if override != nil {
		override(cfg)
		if err := cfg.Validate(); err != nil {
			return nil, err
		}
	}
	if err := Check(cfg); err != nil {
		return nil, err
	}
	if err := Preflight(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// Check validates what package config leaves to the transports (their
// options) without opening anything; errors wrap config.ErrConfigInvalid
// (transports.Check).
func Check(cfg *config.Config) error { return transports.Check(cfg) }

// NewLogger builds the process logger of l, writing to w.
func NewLogger(l config.Logging, w io.Writer) (zerolog.Logger, error) {
	level, err := zerolog.ParseLevel(strings.ToLower(l.Level))
	if err != nil || level == zerolog.NoLevel {
		return zerolog.Logger{}, fmt.Errorf("log level %q: want trace, debug, info, warn or error", l.Level)
	}
	out := w
	switch l.Format {
	case "", "json":
	case "console":
		out = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05"}
	default:
		return zerolog.Logger{}, fmt.Errorf("log format %q: want json or console", l.Format)
	}
	return zerolog.New(out).Level(level).With().Timestamp().Logger(), nil
}
