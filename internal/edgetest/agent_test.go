package edgetest

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// policyAgent is the suite's agent. It records "METHOD host target" of
// every request it is shown and decides by host, path and the x-edge
// header:
//
//	host admin.example    block 403 "admin-blocked"
//	path /blocked…        block 403
//	x-edge: location-js   block 302 with Location: javascript:alert(1)
//	x-edge: location-net  block 302 with Location: //evil.example/
//	x-edge: set-many      allow with 40,000 set operations on distinct names
//	x-edge: refuse-some   allow with 200 operations the rules refuse
//	x-edge: refuse-many   allow with 100,000 operations the rules refuse
//	x-edge: big-value     allow, setting a header to a 1 MiB value
//	x-edge: resp-location allow, setting the response's Location to javascript:
//	x-edge: dup-set       allow, setting the response header x-dup (sent twice upstream)
//	x-edge: ctl-…         header values with control characters (ctlReply)
//	anything else         allow, adding x-agent: seen to the upstream request
type policyAgent struct {
	sdk.Base
	mu   sync.Mutex
	seen []string
}

func newPolicyAgent() *policyAgent {
	return &policyAgent{Base: sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}}}
}

func (a *policyAgent) take() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.seen
	a.seen = nil
	return s
}

var bigValue = bytes.Repeat([]byte("v"), 1<<20)

func (a *policyAgent) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	host, edge := "", ""
	for _, h := range m.Headers {
		switch string(h.Name) {
		case "host":
			host = string(h.Value)
		case "x-edge":
			edge = string(h.Value)
		}
	}
	a.mu.Lock()
	a.seen = append(a.seen, string(m.Method)+" "+host+" "+string(m.URI))
	a.mu.Unlock()
	op := func(k protocol.HeaderOpKind, name string, value []byte) protocol.HeaderOp {
		return protocol.HeaderOp{Op: k, Name: []byte(name), Value: value}
	}
	switch {
	case strings.HasPrefix(strings.ToLower(host), "admin.example"):
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("admin-blocked")
	case bytes.HasPrefix(m.URI, []byte("/blocked")):
		d.Kind, d.Status, d.Body = protocol.DecisionBlock, 403, []byte("blocked")
	case edge == "location-js":
		d.Kind, d.Status = protocol.DecisionBlock, 302
		d.BlockHeaders = append(d.BlockHeaders, protocol.Header{Name: []byte("Location"), Value: []byte("javascript:alert(1)")})
	case edge == "location-net":
		d.Kind, d.Status = protocol.DecisionBlock, 302
		d.BlockHeaders = append(d.BlockHeaders, protocol.Header{Name: []byte("Location"), Value: []byte("//evil.example/")})
	case edge == "set-many":
		for i := 0; i < 40000; i++ {
			d.RequestHeaderOps = append(d.RequestHeaderOps, op(protocol.HeaderSet, "x-many-"+strconv.Itoa(i), []byte("1")))
		}
	case edge == "refuse-some":
		for i := 0; i < 200; i++ {
			d.RequestHeaderOps = append(d.RequestHeaderOps, op(protocol.HeaderSet, "host", []byte("evil")))
		}
	case edge == "refuse-many":
		for i := 0; i < 100000; i++ {
			d.RequestHeaderOps = append(d.RequestHeaderOps, op(protocol.HeaderSet, "host", []byte("evil")))
		}
	case edge == "big-value":
		d.RequestHeaderOps = append(d.RequestHeaderOps, op(protocol.HeaderSet, "x-big", bigValue))
	case edge == "resp-location":
		d.ResponseHeaderOps = append(d.ResponseHeaderOps, op(protocol.HeaderSet, "location", []byte("javascript:alert(1)")))
	case edge == "dup-set":
		d.ResponseHeaderOps = append(d.ResponseHeaderOps, op(protocol.HeaderSet, "x-dup", []byte("agent")))
	case strings.HasPrefix(edge, "ctl-"):
		ctlReply(edge, d)
	default:
		d.RequestHeaderOps = append(d.RequestHeaderOps, op(protocol.HeaderAdd, "x-agent", []byte("seen")))
	}
	return nil
}
