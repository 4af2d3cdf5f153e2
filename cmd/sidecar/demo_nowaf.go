//go:build nowaf

package main

import (
	"errors"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// errDemoNoWAF: the binary was built with the nowaf tag.
var errDemoNoWAF = errors.New("demo: this sidecar was built without the WAF agent (tag nowaf)")

func newDemoWAF(*config.Agent, *zerolog.Logger) (demoWAF, error) { return nil, errDemoNoWAF }
