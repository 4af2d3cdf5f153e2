package supervisor

import (
	"fmt"
	"net"
	"os"
	"sync"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/systemd"
)

// inherited holds the listening sockets a service manager passed
// (socket activation) for the data listeners: a listener takes the one
// of its name (FileDescriptorName= equal to the listener's name) and
// address, else of its name, else of its address. The listener gets a
// duplicate and the original stays here until shutdown, so that a
// listener a reload removes and a later reload adds again finds it
// (the manager keeps the socket listening: binding it anew would fail).
type inherited struct {
	mu  sync.Mutex
	log zerolog.Logger
	fds []inheritedFD
}

type inheritedFD struct {
	systemd.Inherited
	taken bool
}

func newInherited(log zerolog.Logger) (*inherited, error) {
	fds, err := systemd.Listeners()
	if err != nil {
		return nil, err
	}
	h := &inherited{log: log}
	for _, fd := range fds {
		h.fds = append(h.fds, inheritedFD{Inherited: fd})
	}
	return h, nil
}

// take is dataplane.Config.Listen: a duplicate of the inherited socket
// of listener name at addr, or nil.
func (h *inherited) take(name, addr string) (net.Listener, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i := -1
	for _, pass := range []func(fd *inheritedFD) bool{
		func(fd *inheritedFD) bool { return fd.Name == name && systemd.Match(fd.Listener, addr) },
		func(fd *inheritedFD) bool { return fd.Name == name && !fd.taken },
		func(fd *inheritedFD) bool { return systemd.Match(fd.Listener, addr) },
	} {
		for j := range h.fds {
			if pass(&h.fds[j]) {
				i = j
				break
			}
		}
		if i >= 0 {
			break
		}
	}
	if i < 0 {
		return nil, nil
	}
	fd := &h.fds[i]
	f, err := fd.Listener.(interface{ File() (*os.File, error) }).File()
	if err != nil {
		return nil, fmt.Errorf("inherited socket %s: %w", fd.Name, err)
	}
	defer f.Close()
	ln, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("inherited socket %s: %w", fd.Name, err)
	}
	fd.taken = true
	h.log.Info().Str("listener", name).Str("fd_name", fd.Name).Str("address", ln.Addr().String()).
		Msg("listener socket inherited from the service manager")
	return ln, nil
}

// warnUnused logs the inherited sockets no listener took.
func (h *inherited) warnUnused() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fd := range h.fds {
		if !fd.taken {
			h.log.Warn().Str("fd_name", fd.Name).Str("address", fd.Listener.Addr().String()).
				Msg("an inherited socket matches no listener by name or address; it stays open, unserved")
		}
	}
}

// close closes the inherited sockets (the listeners close their
// duplicates).
func (h *inherited) close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fd := range h.fds {
		_ = fd.Listener.Close()
	}
	h.fds = nil
}

// notify tells the service manager state (READY=1, STOPPING=1) when it
// asked for it (NOTIFY_SOCKET); a failure is logged, not fatal.
func (s *Supervisor) notify(state string) {
	if _, err := systemd.Notify(state); err != nil {
		s.log.Warn().Err(err).Str("state", state).Msg("service manager notification failed")
	}
}
