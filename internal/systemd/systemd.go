// Package systemd speaks the two service protocols of systemd a daemon
// needs, without a library: socket activation (sd_listen_fds: listening
// sockets inherited from the service manager as fds 3.., named by
// LISTEN_FDNAMES) and readiness notification (sd_notify: READY=1,
// STOPPING=1 as datagrams to $NOTIFY_SOCKET).
//
// With a socket unit, the manager holds the listening sockets across a
// restart of the service: connections that arrive while no process
// accepts wait in the socket's backlog for the next one, so a restart
// refuses none.
package systemd

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// listenFDsStart is the first inherited descriptor (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// ErrSocketActivation: LISTEN_FDS or the descriptors it names are not
// usable.
var ErrSocketActivation = errors.New("systemd: socket activation")

// Inherited is one listening socket passed by the service manager.
type Inherited struct {
	// Name is its FileDescriptorName= (from LISTEN_FDNAMES; the manager
	// defaults it to the socket unit's name).
	Name string
	// Listener serves the socket.
	Listener net.Listener
}

// Listeners returns the listening sockets the service manager passed to
// this process, as sd_listen_fds(3) with unset_environment: none unless
// LISTEN_PID is this process's id (the variables were meant for another
// process otherwise), and LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES are
// unset so that child processes do not take them for theirs. Each
// descriptor is set close-on-exec; one that is not a listening stream
// socket is an error.
func Listeners() ([]Inherited, error) {
	pid, fds, names := os.Getenv("LISTEN_PID"), os.Getenv("LISTEN_FDS"), os.Getenv("LISTEN_FDNAMES")
	if fds == "" {
		return nil, nil
	}
	defer func() {
		_ = os.Unsetenv("LISTEN_PID")
		_ = os.Unsetenv("LISTEN_FDS")
		_ = os.Unsetenv("LISTEN_FDNAMES")
	}()
	if p, err := strconv.Atoi(pid); err != nil || p != os.Getpid() {
		return nil, nil
	}
	n, err := strconv.Atoi(fds)
	if err != nil || n < 0 || n > 1024 {
		return nil, fmt.Errorf("%w: LISTEN_FDS=%q", ErrSocketActivation, fds)
	}
	var nameList []string
	if names != "" {
		nameList = strings.Split(names, ":")
	}
	out := make([]Inherited, 0, n)
	for i := range n {
		fd := listenFDsStart + i
		syscall.CloseOnExec(fd)
		name := "unknown" // sd_listen_fds_with_names' default
		if i < len(nameList) {
			name = nameList[i]
		}
		f := os.NewFile(uintptr(fd), "LISTEN_FD_"+strconv.Itoa(fd))
		ln, err := net.FileListener(f) // a dup: f is closed below
		_ = f.Close()
		if err != nil {
			for _, o := range out {
				_ = o.Listener.Close()
			}
			return nil, fmt.Errorf("%w: fd %d (%s) is not a listening socket: %v", ErrSocketActivation, fd, name, err)
		}
		out = append(out, Inherited{Name: name, Listener: ln})
	}
	return out, nil
}

// Notify sends state (e.g. "READY=1") to the service manager when
// $NOTIFY_SOCKET names one, as sd_notify(3); it reports whether it was
// sent. A name starting with '@' is in the abstract namespace.
func Notify(state string) (bool, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return false, nil
	}
	if path[0] == '@' {
		path = "\x00" + path[1:]
	} else if path[0] != '/' {
		return false, fmt.Errorf("systemd: NOTIFY_SOCKET %q is neither a path nor abstract", path)
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return false, fmt.Errorf("systemd: notify: %w", err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(state)); err != nil {
		return false, fmt.Errorf("systemd: notify: %w", err)
	}
	return true, nil
}

// Match reports whether ln listens on the configured address addr
// ("host:port" or "unix:/path"): the same path, or the same port and IP
// (an unspecified host matches an unspecified IP only). Port 0 matches
// nothing: it asks for a new port.
func Match(ln net.Listener, addr string) bool {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		ua, ok := ln.Addr().(*net.UnixAddr)
		return ok && ua.Name == path
	}
	ta, ok := ln.Addr().(*net.TCPAddr)
	if !ok {
		return false
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "0" || port != strconv.Itoa(ta.Port) {
		return false
	}
	if host == "" {
		return ta.IP.IsUnspecified()
	}
	if ip := net.ParseIP(host); ip != nil {
		return ip.Equal(ta.IP) || (ip.IsUnspecified() && ta.IP.IsUnspecified())
	}
	// A name: what it resolves to now.
	ips, err := net.LookupIP(host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if ip.Equal(ta.IP) {
			return true
		}
	}
	return false
}
