// Package job is the one policy every agent and auth server of the peer
// benchmark applies, so that the rows do the same job: requests for /admin
// (and below it) are denied with 403, every other request is allowed and
// gets X-Agent-Processed: true on its way to the upstream.
package job

import "bytes"

// Header and value the agents add to allowed requests.
const (
	Header = "X-Agent-Processed"
	Value  = "true"
)

// DenyStatus is the status of a denied request.
const DenyStatus = 403

var admin = []byte("/admin")

// Denied reports whether the request target (path, optionally with a query
// string) is /admin or below it.
func Denied(target []byte) bool {
	if i := bytes.IndexAny(target, "?#"); i >= 0 {
		target = target[:i]
	}
	if !bytes.HasPrefix(target, admin) {
		return false
	}
	return len(target) == len(admin) || target[len(admin)] == '/'
}
