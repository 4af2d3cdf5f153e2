package reverse

import (
	"crypto/tls"
	"net"
)

// peerKey names the source of a connection for the failure table: the
// IP address for TCP (the /64 for IPv6, which one host can fill at will)
// and the peer's user id for a Unix socket where the system tells it.
func peerKey(nc net.Conn) string {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn()
	}
	switch a := nc.RemoteAddr().(type) {
	case *net.TCPAddr:
		if ip4 := a.IP.To4(); ip4 != nil {
			return "tcp:" + ip4.String()
		}
		return "tcp:" + a.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	if uc, ok := nc.(*net.UnixConn); ok {
		return unixPeer(uc)
	}
	return "other"
}
