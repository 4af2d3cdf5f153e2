package sdk

import (
	"context"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/gomaxprocs"
)

// AdaptGOMAXPROCS sizes the agent process's GOMAXPROCS to its load until
// ctx ends: fewer Ps while the CPU the process uses fits in them, more as
// soon as it does not (read every 100ms, at least doubling at each
// reading, up to the Go runtime's default; lowered after 2s of lighter
// load); then the default again, and the returned channel closes. It
// returns at once. It starts from the runtime's default, replacing a
// GOMAXPROCS the program set in code.
// The sidecar does the same for itself by default (sidecar run
// -gomaxprocs).
//
// Use it for an agent that is mostly far from busy. With idle Ps, each
// event that wakes the agent makes the Go scheduler wake another thread
// for nothing: at 2 000 requests/s on 2 vCPUs, the peer benchmark's SDK
// agent cost 76–79 µs of CPU per request with GOMAXPROCS=2 and 35–36 with
// GOMAXPROCS=1 (docs/operations.md, "CPU per request at a light load").
//
// It changes nothing and returns an error wrapping ErrNotAdapting when
// the GOMAXPROCS environment variable is set, when the runtime's default
// is already 1, when the process's CPU time cannot be read (systems other
// than Unix), or when it is already adapting.
func AdaptGOMAXPROCS(ctx context.Context) (done <-chan struct{}, err error) {
	return gomaxprocs.Start(ctx, gomaxprocs.DefaultConfig(), zerolog.Nop())
}

// ErrNotAdapting is wrapped by AdaptGOMAXPROCS's error when it leaves
// GOMAXPROCS alone.
var ErrNotAdapting = gomaxprocs.ErrNotAdapting
