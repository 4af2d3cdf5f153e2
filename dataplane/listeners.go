package dataplane

import (
	"context"
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/zentinelproxy/sidecar/dataplane/internal/http1"
	"github.com/zentinelproxy/sidecar/dataplane/internal/http2"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// Listeners on reload. Under ListenAndServe, a Swap applies the
// configuration's listeners, matched by name:
//
//   - unchanged, or changed only in the contents of its TLS block (which
//     ReloadTLS re-reads): kept, connections and all;
//   - new: bound before anything else changes (a failure to bind fails
//     the Swap, which then changes nothing) and served once the new
//     routing table is published;
//   - gone: stops accepting at once; its requests in flight finish, its
//     idle connections close, within retireDrain;
//   - changed otherwise (address, limits, timeouts, TLS on or off): the
//     old listener is retired and a new one with the new settings serves.
//     At the same address the new one takes over the old one's socket
//     (Detach), so nothing is refused meanwhile; connections already
//     open finish on the old settings, and once the Swap returns only
//     the new one accepts. A listener added at the address of
//     one removed (renamed) takes its socket the same way.
//
// Under Serve (a socket the caller gave), listeners are not changed.

// retireDrain bounds how long a listener a reload removed may take to
// finish its requests in flight (and its Upgrade tunnels) before they
// are cut.
const retireDrain = 30 * time.Second

// liveListener is what the server keeps of one listener: its settings as
// the file gives them (before the descriptor budget clamps them: what a
// reload compares), its socket, and its Serve's end.
type liveListener struct {
	file config.Listener
	ln   net.Listener
	// done is closed when the listener's Serve has returned (a socket
	// handed over is served by its next listener only then).
	done chan struct{}
	// removed: a reload retired it; its Serve's end is no failure.
	removed atomic.Bool
}

// listenerPlan is a Swap's change of listeners, bound but not yet served.
type listenerPlan struct {
	next    []*http1.Listener // the listeners in the new configuration's order
	added   []*http1.Listener
	removed []*http1.Listener
	// after: an added listener that takes over a removed one's socket
	// starts once that one's Serve has returned.
	after map[*http1.Listener]chan struct{}
	// handed: the removed listeners whose socket moves on (not closed).
	handed map[*http1.Listener]bool
	live   map[*http1.Listener]*liveListener
}

// planListeners works out and binds the listener changes of cfg, under
// s.mu. nil: nothing changes.
func (s *Server) planListeners(cfg *config.Config) (*listenerPlan, error) {
	if !s.managed {
		old := make([]config.Listener, 0, len(s.lsts))
		for _, l := range s.lsts {
			old = append(old, s.live[l].file)
		}
		if config.ListenersNeedRestart(old, cfg.Listeners) {
			s.log.Warn().Msg("reload: the listeners are not changed when the server serves a given socket")
		}
		return nil, nil
	}
	cur := make(map[string]*http1.Listener, len(s.lsts))
	for _, l := range s.lsts {
		cur[l.Config().Name] = l
	}
	p := &listenerPlan{after: map[*http1.Listener]chan struct{}{}, handed: map[*http1.Listener]bool{},
		live: map[*http1.Listener]*liveListener{}}
	kept := map[*http1.Listener]bool{}
	for _, lc := range cfg.Listeners {
		if old := cur[lc.Name]; old != nil && !config.ListenersNeedRestart([]config.Listener{s.live[old].file}, []config.Listener{lc}) {
			kept[old] = true
		}
	}
	// Sockets that can move from a listener going away to one coming at
	// the same address: those whose Accept a deadline wakes (Detach).
	byAddr := map[string]*http1.Listener{}
	for _, l := range s.lsts {
		_, wakes := s.live[l].ln.(interface{ SetDeadline(time.Time) error })
		if !kept[l] && wakes && portFixed(s.live[l].file.Address) {
			byAddr[s.live[l].file.Address] = l
		}
	}
	nofile := fdLimit()
	budget := connectionBudget(cfg, nofile)
	var err error
	var next []*http1.Listener
	for _, lc := range cfg.Listeners {
		if old := cur[lc.Name]; old != nil && kept[old] {
			next = append(next, old)
			continue
		}
		var l *http1.Listener
		if l, err = s.newListener(lc, budget, nofile); err != nil {
			break
		}
		ll := &liveListener{file: lc, done: make(chan struct{})}
		if from := byAddr[lc.Address]; from != nil && !p.handed[from] {
			ll.ln = s.live[from].ln
			p.handed[from] = true
			p.after[l] = s.live[from].done
		} else if ll.ln, err = s.bind(&lc); err != nil {
			l.Close()
			err = fmt.Errorf("dataplane: listener %s: %w", lc.Name, err)
			break
		}
		p.live[l] = ll
		p.added = append(p.added, l)
		next = append(next, l)
	}
	if err != nil {
		p.abort()
		return nil, err
	}
	p.next = next
	for _, l := range s.lsts {
		if !kept[l] {
			p.removed = append(p.removed, l)
		}
	}
	return p, nil
}

// portFixed reports an address whose socket can be handed over: a
// configured port 0 asks for a new one.
func portFixed(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err != nil || port != "0" // unix: paths have no port
}

// newListener makes the listener of lc, clamped to the descriptor budget.
func (s *Server) newListener(lc config.Listener, budget int, nofile uint64) (*http1.Listener, error) {
	explicit := lc.MaxConnections != 0
	if clampConnections(&lc, budget, nofile, s.log) {
		s.clamped.Add(1)
	}
	if clampTunnels(&lc, budget, nofile, explicit, s.log) {
		s.clamped.Add(1)
	}
	l, err := http1.NewListener(lc, s.core, s.log, &s.h1)
	if err != nil {
		return nil, fmt.Errorf("dataplane: listener %s: %w", lc.Name, err)
	}
	if lc := l.Config(); lc.Serves(config.ProtoH2) || lc.Serves(config.ProtoH2C) {
		h2, err := http2.NewServer(lc, l.Facts(), s.core, s.log, &s.h2)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("dataplane: listener %s: %w", lc.Name, err)
		}
		l.SetHTTP2(h2)
	}
	return l, nil
}

// abort undoes a plan that will not be committed: it closes the sockets
// it bound and stops the listeners it made.
func (p *listenerPlan) abort() {
	if p == nil {
		return
	}
	for _, l := range p.added {
		if ll := p.live[l]; ll != nil {
			if _, handed := p.after[l]; !handed && ll.ln != nil {
				_ = ll.ln.Close()
			}
		}
		l.Close()
	}
}

// commitListeners applies p under s.mu: the new listeners serve, the
// removed ones retire. It returns the ends of the Serves of those whose
// socket it handed over (Swap waits for them).
func (s *Server) commitListeners(p *listenerPlan) (dones []chan struct{}) {
	if p == nil {
		return nil
	}
	for l, ll := range p.live {
		s.live[l] = ll
	}
	s.lsts = p.next
	for _, l := range p.removed {
		ll := s.live[l]
		ll.removed.Store(true)
		handed := p.handed[l]
		if handed {
			l.Detach() // its Serve returns; the socket stays open
			dones = append(dones, ll.done)
		} else if ll.ln != nil {
			// Closed here, not by retire's Shutdown on its goroutine: once
			// the reload returns, the removed listener accepts nothing.
			_ = ll.ln.Close()
		}
		s.log.Info().Str("listener", l.Config().Name).Str("address", ll.file.Address).Bool("socket_handed_over", handed).Msg("reload: listener removed; its connections finish")
		s.retire(l, ll)
	}
	for _, l := range p.added {
		s.start(l, p.after[l])
		s.log.Info().Str("listener", l.Config().Name).Str("address", p.live[l].file.Address).Msg("reload: listener added")
	}
	return dones
}

// start serves l on its socket once after is closed (nil: at once). Its
// Serve's error is the server's failure unless a reload removed it.
func (s *Server) start(l *http1.Listener, after <-chan struct{}) {
	ll := s.live[l]
	go func() {
		defer close(ll.done)
		if after != nil {
			<-after
		}
		if err := s.serve(l, ll.ln); err != nil && !ll.removed.Load() {
			select {
			case s.failc <- fmt.Errorf("dataplane: listener %s: %w", l.Config().Name, err):
			default:
			}
		}
	}()
}

// retire drains a removed listener within retireDrain (Shutdown waits
// for it) and stops its certificate watcher.
func (s *Server) retire(l *http1.Listener, ll *liveListener) {
	s.retiring.Add(1)
	go func() {
		defer s.retiring.Done()
		ctx, cancel := context.WithTimeout(context.Background(), retireDrain)
		defer cancel()
		_ = l.Shutdown(ctx) // closes the socket unless Detach handed it over
		<-ll.done
		for l.Lingering() > 0 && ctx.Err() == nil {
			time.Sleep(5 * time.Millisecond)
		}
		l.DrainTunnels(ctx)
		l.Close()
	}()
}
