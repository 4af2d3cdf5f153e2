package exchange

import (
	"fmt"

	"github.com/zentinelproxy/sidecar/protocol"
)

// Header operations of agent replies.
//
// Applying one operation scans the header list (set and remove must find
// every header of that name), so a reply of n operations on m headers
// costs n·m; applied one by one, a reply with 40,000 set operations
// burned 5.4 s of CPU. Two things bound it now:
//
//   - limits per reply (AgentLimits: operations, bytes, one value, the
//     resulting header block), checked in O(n) before anything is applied;
//     a reply over them is an agent error for the failure policy;
//   - replies with more than smallBatch operations are applied through a
//     hash index over the header names (hdrIndex), in O(n + m).
//
// Small replies, the common case, keep the plain scans: no index to build.

// smallBatch is the operation count up to which scans beat building the
// index (each scan of a typical 10–20 header list is ~100 ns).
const smallBatch = 8

// errLimit is a reply over its agent's limits.
var errLimit = fmt.Errorf("%w: header limits exceeded", errInvalidReply)

// agentLimits are an agent's AgentLimits, resolved.
type agentLimits struct {
	ops, bytes, value, block int
}

// lineCost is what one header line adds to a header block ("name: value\r\n").
func lineCost(name, value []byte) int { return len(name) + len(value) + 4 }

// checkLimits checks agent i's decision against its limits in one pass,
// before any of it is applied.
func (ex *Exchange) checkLimits(i int, d *protocol.Decision) error {
	lim := &ex.slots[i].ra.a.limits
	n := len(d.RequestHeaderOps) + len(d.ResponseHeaderOps) + len(d.BlockHeaders)
	if n == 0 {
		return nil
	}
	if n > lim.ops {
		return fmt.Errorf("%w: %d header operations in one reply (limit %d)", errLimit, n, lim.ops)
	}
	total, reqGrowth, respGrowth := 0, 0, 0
	big := -1
	for k := range d.RequestHeaderOps {
		op := &d.RequestHeaderOps[k]
		total += len(op.Name) + len(op.Value)
		big = max(big, len(op.Value))
		if op.Op != protocol.HeaderRemove {
			reqGrowth += lineCost(op.Name, op.Value)
		}
	}
	for k := range d.ResponseHeaderOps {
		op := &d.ResponseHeaderOps[k]
		total += len(op.Name) + len(op.Value)
		big = max(big, len(op.Value))
		if op.Op != protocol.HeaderRemove {
			respGrowth += lineCost(op.Name, op.Value)
		}
	}
	for k := range d.BlockHeaders {
		bh := &d.BlockHeaders[k]
		total += len(bh.Name) + len(bh.Value)
		big = max(big, len(bh.Value))
		respGrowth += lineCost(bh.Name, bh.Value)
	}
	if big > lim.value {
		return fmt.Errorf("%w: a %d-byte header value (limit %d)", errLimit, big, lim.value)
	}
	if total > lim.bytes {
		return fmt.Errorf("%w: %d bytes of header names and values in one reply (limit %d)", errLimit, total, lim.bytes)
	}
	if reqGrowth > 0 && !ex.reqSent {
		if size := ex.reqBlockSize() + reqGrowth; size > lim.block {
			return fmt.Errorf("%w: request header block would reach %d bytes (limit %d)", errLimit, size, lim.block)
		}
	}
	if respGrowth > 0 {
		if size := ex.respBlockSize() + ex.respStashed + respGrowth; size > lim.block {
			return fmt.Errorf("%w: response header block would reach %d bytes (limit %d)", errLimit, size, lim.block)
		}
	}
	return nil
}

// reqBlockSize is the size of the upstream request's header block as it
// stands.
func (ex *Exchange) reqBlockSize() int {
	n := lineCost(nameHost, ex.upHost)
	for _, kv := range ex.hdr {
		n += lineCost(kv.Name, kv.Value)
	}
	return n
}

// respBlockSize is the size of the upstream response's header block (0
// before it arrived).
func (ex *Exchange) respBlockSize() int {
	if !ex.respSeen {
		return 0
	}
	n := 0
	for _, f := range ex.res.Head().Fields {
		n += lineCost(f.Name, f.Value)
	}
	return n
}

// hgroup is the headers of one name in a header list: the first and last
// live entries of the chain linked through hdrIndex.next (-1: none).
type hgroup struct {
	name        []byte
	first, last int32
}

// hdrIndex indexes a header list by name for a batch of operations. Its
// slices are scratch kept with the request state.
type hdrIndex struct {
	slots  []int32 // open addressing: group index + 1, 0 empty
	mask   uint32
	groups []hgroup
	next   []int32 // per list entry: next entry of the same name, -1
}

// foldHash is FNV-1a over the ASCII lower-case bytes of b.
func foldHash(b []byte) uint32 {
	h := uint32(2166136261)
	for _, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		h ^= uint32(c)
		h *= 16777619
	}
	return h
}

// build indexes list, with room for extra more names.
func (x *hdrIndex) build(list []Field, extra int) {
	size := 16
	for size < 2*(len(list)+extra) {
		size <<= 1
	}
	if cap(x.slots) < size {
		x.slots = make([]int32, size)
	} else {
		x.slots = x.slots[:size]
		clear(x.slots)
	}
	x.mask = uint32(size - 1)
	x.groups = x.groups[:0]
	x.next = x.next[:0]
	for k := range list {
		x.next = append(x.next, -1)
		g := x.group(list[k].Name)
		if x.groups[g].last >= 0 {
			x.next[x.groups[g].last] = int32(k)
		} else {
			x.groups[g].first = int32(k)
		}
		x.groups[g].last = int32(k)
	}
}

// group finds or creates the group of name.
func (x *hdrIndex) group(name []byte) int {
	for s := foldHash(name) & x.mask; ; s = (s + 1) & x.mask {
		g := x.slots[s]
		if g == 0 {
			x.groups = append(x.groups, hgroup{name: name, first: -1, last: -1})
			x.slots[s] = int32(len(x.groups))
			return len(x.groups) - 1
		}
		if eqFold(x.groups[g-1].name, name) {
			return int(g - 1)
		}
	}
}

// kill marks the entries of a chain dead (nil name), from entry from on.
func (x *hdrIndex) kill(list []Field, from int32) {
	for k := from; k >= 0; k = x.next[k] {
		list[k].Name = nil
	}
}

// apply applies one operation; name and value must outlive the list.
func (x *hdrIndex) apply(list []Field, op protocol.HeaderOpKind, name, value []byte) []Field {
	g := x.group(name)
	grp := &x.groups[g]
	switch op {
	case protocol.HeaderSet:
		if grp.first >= 0 {
			f := grp.first
			list[f].Value = value
			x.kill(list, x.next[f])
			x.next[f] = -1
			grp.last = f
			return list
		}
		fallthrough
	case protocol.HeaderAdd:
		k := int32(len(list))
		list = append(list, Field{Name: name, Value: value})
		x.next = append(x.next, -1)
		grp = &x.groups[g]
		if grp.last >= 0 {
			x.next[grp.last] = k
		} else {
			grp.first = k
		}
		grp.last = k
	case protocol.HeaderRemove:
		x.kill(list, grp.first)
		grp.first, grp.last = -1, -1
	}
	return list
}

// compact drops the dead entries of list, keeping the order.
func compact(list []Field) []Field {
	out := list[:0]
	for _, kv := range list {
		if kv.Name != nil {
			out = append(out, kv)
		}
	}
	return out
}

// applyReqOps applies agent i's request header operations (already within
// its limits) to the upstream request's header list, and records them in
// ex.opLog for the client's view (clientview.go), to which they apply
// too. Refused operations are skipped and reported once for the reply.
func (ex *Exchange) applyReqOps(i int, ops []protocol.HeaderOp) {
	if len(ops) == 0 {
		return
	}
	if ex.reqSent {
		if e := ex.core.log.Debug(); e != nil {
			ex.logFields(e).Str("agent", ex.slots[i].ra.a.name).Int("ops", len(ops)).
				Msg("request header operations after the request was sent: ignored")
		}
		return
	}
	var ref refusals
	if len(ops) <= smallBatch {
		for k := range ops {
			op := &ops[k]
			if ex.refuseOp(&ref, op.Op, op.Name, op.Value) {
				continue
			}
			ex.reqOp(op.Op, op.Name, op.Value)
		}
	} else {
		x := &ex.hidx
		x.build(ex.hdr, len(ops))
		list := ex.hdr
		for k := range ops {
			op := &ops[k]
			if ex.refuseOp(&ref, op.Op, op.Name, op.Value) {
				continue
			}
			name, value := ex.keep(op.Name), []byte(nil)
			if op.Op != protocol.HeaderRemove {
				value = ex.keep(op.Value)
			}
			list = x.apply(list, op.Op, name, value)
			ex.opLog = append(ex.opLog, loggedOp{op: op.Op, name: name, value: value})
		}
		ex.hdr = compact(list)
		ex.viewDirty = true
	}
	ex.reportRefused(i, &ref)
}

// stashRespOps records agent i's response header operations (already
// within its limits) to be applied to the client response.
func (ex *Exchange) stashRespOps(i int, ops []protocol.HeaderOp) {
	if len(ops) == 0 {
		return
	}
	if ex.respStarted {
		if e := ex.core.log.Debug(); e != nil {
			ex.logFields(e).Str("agent", ex.slots[i].ra.a.name).Int("ops", len(ops)).
				Msg("response header operations after the response started: ignored")
		}
		return
	}
	var ref refusals
	for k := range ops {
		op := &ops[k]
		if ex.refuseOp(&ref, op.Op, op.Name, op.Value) {
			continue
		}
		st := stashedOp{op: op.Op, slot: uint8(i)}
		st.nameOff, st.nameLen = uint32(len(ex.opArena)), uint32(len(op.Name))
		ex.opArena = append(ex.opArena, op.Name...)
		st.valOff, st.valLen = uint32(len(ex.opArena)), uint32(len(op.Value))
		ex.opArena = append(ex.opArena, op.Value...)
		ex.respOps = append(ex.respOps, st)
		if op.Op != protocol.HeaderRemove {
			ex.respStashed += lineCost(op.Name, op.Value)
		}
	}
	ex.reportRefused(i, &ref)
}

// applyStashed applies the response operations not yet applied to the
// client response (response-phase agents see the headers as changed by
// the agents before them).
func (ex *Exchange) applyStashed() {
	ops := ex.respOps[ex.respOpsApplied:]
	ex.respOpsApplied = len(ex.respOps)
	if len(ops) == 0 {
		return
	}
	r := &ex.resp
	r.Origin = nil // the head is no longer the upstream's as it came
	if len(ops) <= smallBatch {
		for _, op := range ops {
			name := ex.opArena[op.nameOff : op.nameOff+op.nameLen]
			val := ex.opArena[op.valOff : op.valOff+op.valLen]
			r.Fields = applyRespOp(r.Fields, op.op, name, val)
		}
		return
	}
	// A large batch goes through the index (set replaces the first
	// header of its name in place).
	x := &ex.hidx
	x.build(r.Fields, len(ops))
	list := r.Fields
	for _, op := range ops {
		name := ex.opArena[op.nameOff : op.nameOff+op.nameLen]
		val := ex.opArena[op.valOff : op.valOff+op.valLen]
		list = x.apply(list, op.op, name, val)
	}
	r.Fields = compact(list)
}

// applyRespOp applies one response header operation to list. A set
// leaves exactly one header of the name, at the end of the list.
func applyRespOp(list []Field, op protocol.HeaderOpKind, name, value []byte) []Field {
	switch op {
	case protocol.HeaderSet:
		return append(delIn(list, name), Field{Name: name, Value: value})
	case protocol.HeaderAdd:
		return append(list, Field{Name: name, Value: value})
	case protocol.HeaderRemove:
		return delIn(list, name)
	}
	return list
}

// refusals aggregates the operations of one reply the security rules
// refused, for one log line per reply.
type refusals struct {
	n     int
	name  []byte
	cause string
}

// refuseOp checks one operation against the security rules; a refused
// one is counted in ref and true is returned.
func (ex *Exchange) refuseOp(ref *refusals, op protocol.HeaderOpKind, name, value []byte) bool {
	o := protocol.HeaderOp{Op: op, Name: name, Value: value}
	var why string
	ex.scratch, why = checkOp(ex.scratch, &o)
	if why == "" {
		return false
	}
	if ref.n == 0 {
		ref.name, ref.cause = name, why
	}
	ref.n++
	return true
}

// reportRefused counts and logs (once) the operations of agent i's reply
// that were refused.
func (ex *Exchange) reportRefused(i int, ref *refusals) {
	if ref.n == 0 {
		return
	}
	a := ex.slots[i].ra.a
	ex.core.stats.refused.Add(uint64(ref.n))
	for k := 0; k < ref.n; k++ {
		ex.core.obs.MutationRefused(ex.rt.idx, a.idx)
	}
	ok, suppressed := a.logRefused.Allow()
	if !ok {
		return
	}
	name := ref.name
	if len(name) > 64 {
		name = name[:64]
	}
	e := ex.logFields(ex.core.log.Warn()).Str("agent", a.name).Int("refused", ref.n).
		Bytes("first_header", name).Str("first_reason", ref.cause)
	if suppressed > 0 {
		e = e.Uint64("suppressed", suppressed)
	}
	e.Msg("agent header operations refused")
}
