package reverse

import (
	"net"
	"strconv"
	"syscall"
)

// unixPeer keys a Unix socket peer by its user id (SO_PEERCRED): a process
// id would let one user fork its way to fresh budgets.
func unixPeer(uc *net.UnixConn) string {
	rc, err := uc.SyscallConn()
	if err != nil {
		return "unix"
	}
	var cred *syscall.Ucred
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil || cred == nil {
		return "unix"
	}
	return "unix:uid=" + strconv.FormatUint(uint64(cred.Uid), 10)
}
