package supervisor

import (
	"net"
	"sync"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/systemd"
)

// inherited holds the listening sockets a service manager passed
// (socket activation) until a data listener takes one: by its name
// (FileDescriptorName= equal to the listener's name) and address, by its
// name, else by its address.
// Those left over stay open, for a listener a reload adds.
type inherited struct {
	mu  sync.Mutex
	log zerolog.Logger
	fds []systemd.Inherited
}

func newInherited(log zerolog.Logger) (*inherited, error) {
	fds, err := systemd.Listeners()
	if err != nil {
		return nil, err
	}
	return &inherited{log: log, fds: fds}, nil
}

// take is dataplane.Config.Listen: the inherited socket of listener
// name at addr, or nil.
func (h *inherited) take(name, addr string) (net.Listener, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The name and the address, then the name (sockets of one unit share
	// its name), then the address.
	i := -1
	for j, fd := range h.fds {
		if fd.Name == name && systemd.Match(fd.Listener, addr) {
			i = j
			break
		}
	}
	for j := 0; i < 0 && j < len(h.fds); j++ {
		if h.fds[j].Name == name {
			i = j
		}
	}
	for j := 0; i < 0 && j < len(h.fds); j++ {
		if systemd.Match(h.fds[j].Listener, addr) {
			i = j
		}
	}
	if i < 0 {
		return nil, nil
	}
	fd := h.fds[i]
	h.fds = append(h.fds[:i], h.fds[i+1:]...)
	h.log.Info().Str("listener", name).Str("fd_name", fd.Name).Str("address", fd.Listener.Addr().String()).
		Msg("listener socket inherited from the service manager")
	return fd.Listener, nil
}

// warnUnused logs the inherited sockets no listener took.
func (h *inherited) warnUnused() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, fd := range h.fds {
		h.log.Warn().Str("fd_name", fd.Name).Str("address", fd.Listener.Addr().String()).
			Msg("an inherited socket matches no listener by name or address; it stays open, unserved")
	}
}

// close closes the sockets no listener took.
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
