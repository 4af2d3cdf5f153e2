package exchange

import (
	"fmt"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Query rewrites of agent replies (protocol.Decision.SetQuery: ext_authz's
// query_parameters_to_set and _remove). An allow of the request phase
// may replace the query of the target the upstream gets; the path is not
// the agent's to change. The new query is held to the rules of a header
// value an agent sets: visible ASCII (no space, control or non-ASCII
// byte, and no '#', which would end the target), and the whole target
// within the agent's limits.header_value. A reply that breaks them is an
// invalid reply, for the failure policy, counted as over the limits or
// invalid: dropping the rewrite and forwarding the request would send
// what the agent meant to change (a parameter it removes, say).
//
// The agents after it and the upstream see the new target (the view is
// rebuilt); a reply that comes once the request was sent changes
// nothing.

// checkQuery checks agent i's query rewrite d.Query; over reports that
// it is over the limits (else it is invalid).
func (ex *Exchange) checkQuery(i int, d *protocol.Decision) (over bool, err error) {
	for _, c := range d.Query {
		if c <= ' ' || c >= 0x7f || c == '#' {
			return false, fmt.Errorf("%w: query rewrite with byte %#x", errInvalidReply, c)
		}
	}
	t := ex.fwdTarget()
	if len(t) == 0 || t[0] != '/' {
		return false, fmt.Errorf("%w: query rewrite of a target without a path", errInvalidReply)
	}
	n := len(pathOf(t))
	if len(d.Query) > 0 {
		n += 1 + len(d.Query)
	}
	if lim := ex.slots[i].ra.a.limits.value; n > lim {
		return true, fmt.Errorf("%w: query rewrite makes a %d-byte target (limit %d)", errLimit, n, lim)
	}
	return false, nil
}

// applyQuery gives the upstream request's target d.Query as its query
// (checked by checkQuery).
func (ex *Exchange) applyQuery(i int, d *protocol.Decision) {
	if ex.reqSent {
		if e := ex.core.log.Debug(); e != nil {
			ex.logFields(e).Str("agent", ex.slots[i].ra.a.name).Msg("query rewrite after the request was sent: ignored")
		}
		return
	}
	rs := &ex.rs
	// The current target may be rs.targetBuf itself: build in the other
	// buffer, then swap.
	buf := append(rs.queryBuf[:0], pathOf(ex.fwdTarget())...)
	if len(d.Query) > 0 {
		buf = append(buf, '?')
		buf = append(buf, d.Query...)
	}
	rs.queryBuf, rs.targetBuf = rs.targetBuf, buf
	rs.target = buf
	ex.viewDirty = true
}
