package supervisor

import (
	"context"
	"errors"
	"reflect"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// reloadSignal reloads on SIGHUP, through the admin listener when there
// is one so that /status counts it.
func (s *Supervisor) reloadSignal() {
	s.log.Info().Str("config", s.opts.Path).Msg("SIGHUP: reloading the configuration")
	if s.admin != nil {
		_ = s.admin.Reload() // logs the outcome
		return
	}
	if err := s.Reload(); err != nil {
		s.log.Error().Err(err).Msg("configuration reload failed; the previous configuration keeps serving")
		return
	}
	s.log.Info().Msg("configuration reloaded")
}

// Reload re-reads the configuration file (Options.Path) and applies it:
// validate, build what changed, swap, retire what is no longer used. On
// any error the running configuration stays as it was; an error wrapping
// config.ErrConfigSyntax, config.ErrConfigInvalid or
// config.ErrConfigUnreadable is the file's.
//
// Agent instances are reused by transports.InstanceKey: an agent whose
// key did not change keeps its instance and connections, even when its
// failure mode, body policy, request budget or header limits changed,
// because the dataplane rebuilds its routing table — which carries those
// — from the new configuration on the swap: the next request runs under
// the new policy.
func (s *Supervisor) Reload() (err error) {
	if s.metrics != nil {
		defer func() { s.metrics.ConfigReloaded(err) }()
	}
	if s.opts.Path == "" {
		return errors.New("no configuration file to reload")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("shutting down")
	}
	srv := s.srv.Load()
	if srv == nil {
		return errors.New("still starting")
	}
	cfg, err := Load(s.opts.Path, s.opts.Override)
	if err != nil {
		return err
	}
	b, err := s.agents.Build(cfg)
	if err != nil {
		return err
	}
	if fresh := b.Fresh(); len(fresh) > 0 {
		// New agents get the time a start gives them to connect, so that
		// the swap does not turn requests into failures.
		wctx, cancel := context.WithTimeout(context.Background(), s.opts.AgentWait)
		missing := waitAgents(wctx, fresh)
		cancel()
		for _, name := range missing {
			s.log.Warn().Str("agent", name).Msg("reload: agent not connected yet; its failure mode applies until it is")
		}
	}
	if err := srv.Swap(cfg, b.Agents()); err != nil {
		b.Abort()
		return err
	}
	b.Commit()
	for _, w := range Warnings(cfg) {
		s.log.Warn().Str("key", w.Path).Int("line", w.Line).Msg(w.String())
	}
	if changed := restartOnly(s.cfg, cfg); len(changed) > 0 {
		s.log.Warn().Strs("sections", changed).Msg("reload: these settings change only with a restart")
	}
	s.cfg = cfg
	s.setRequired(cfg)
	return nil
}

// restartOnly lists the sections that differ between a and b but are
// only applied at start.
func restartOnly(a, b *config.Config) []string {
	// Data listeners follow the file on a reload (dataplane.Server.Swap).
	var out []string
	if !reflect.DeepEqual(a.Admin, b.Admin) {
		out = append(out, "admin")
	}
	if !reflect.DeepEqual(a.AccessLog, b.AccessLog) {
		out = append(out, "access_log")
	}
	if !reflect.DeepEqual(a.Logging, b.Logging) {
		out = append(out, "logging")
	}
	return out
}
