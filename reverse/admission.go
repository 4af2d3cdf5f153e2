package reverse

import (
	"container/list"
	"net"
)

// The admission table holds the connections that have not registered yet
// and decides which of them gives way when a new one arrives at a limit
// (MaxPending in all, MaxPendingPerPeer from one peer).
//
// A full table never turns the newcomer away while it holds a connection
// that can give way: the newcomer may be the agent, and an attacker that
// keeps the table full must not decide who gets in. Instead the
// connection that has shown the least sign of registering is closed:
//
//  1. the oldest connection seen waiting with nothing received (silent);
//  2. else the oldest connection that is receiving (a TLS handshake or
//     the first frame under way), ordered by when it was accepted or sent
//     its first byte after being silent.
//
// A connection whose first frame is complete is being judged (its token
// is checked, its answer written; microseconds) and never gives way; if
// every connection in the scope is being judged the newcomer is closed
// (busy). A connection that was refused leaves the table before its
// refusal is held back or drained (see Listener.refusing), so refusals
// cannot fill it either.
//
// What this guarantees: an agent that sends its registration as soon as
// it is connected (the SDK does) loses its connection to a newcomer only
// if, meanwhile, no silent connection is left in the scope and
// MaxPendingPerPeer newer connections of its own peer (or MaxPending in
// all) are receiving too. Silent connections, however many and however
// often reopened, cannot keep it out; an attacker must out-pace its round
// trip with connections that send data.
type admission struct {
	maxAll, maxPeer int

	n     int
	tiers [numTiers]list.List // of *pconn, oldest first
	peers map[string]*peerSlots
	all   map[*pconn]struct{} // for Close: every pending connection
}

// peerSlots is one peer's share of the table.
type peerSlots struct {
	n     int
	tiers [numTiers]list.List
}

// Tiers of a pending connection, in the order they give way.
const (
	tierSilent    = iota // seen waiting with nothing received
	tierReceiving        // just accepted, or bytes have arrived
	numTiers
	tierJudged = numTiers // first frame complete: never gives way
)

// pconn is a connection that has not registered yet. Its fields other
// than nc and peer are guarded by Listener.mu.
type pconn struct {
	nc   net.Conn
	raw  net.Conn // nc below TLS: closing it never writes
	peer string

	tier    int
	evicted bool
	silent  bool // evicted while silent (for the log)
	gone    bool // left the table (registered, refused or ended)
	elem    *list.Element
	pelem   *list.Element
}

func newAdmission(maxAll, maxPeer int) *admission {
	return &admission{maxAll: maxAll, maxPeer: maxPeer, peers: make(map[string]*peerSlots), all: make(map[*pconn]struct{})}
}

// admit makes room for pc if a limit is reached and adds it (receiving).
// It returns the connection that gave way (to be closed by the caller,
// outside the lock), or ok false when none could (pc is not added).
func (a *admission) admit(pc *pconn) (victim *pconn, ok bool) {
	ps := a.peers[pc.peer]
	switch {
	case ps != nil && ps.n >= a.maxPeer:
		if victim = oldest(&ps.tiers); victim == nil {
			return nil, false
		}
	case a.n >= a.maxAll:
		if victim = oldest(&a.tiers); victim == nil {
			return nil, false
		}
	}
	if victim != nil {
		victim.evicted, victim.silent = true, victim.tier == tierSilent
		a.remove(victim)
	}
	if ps = a.peers[pc.peer]; ps == nil {
		ps = &peerSlots{}
		a.peers[pc.peer] = ps
	}
	ps.n++
	a.n++
	a.all[pc] = struct{}{}
	pc.tier = tierReceiving
	pc.elem = a.tiers[tierReceiving].PushBack(pc)
	pc.pelem = ps.tiers[tierReceiving].PushBack(pc)
	return victim, true
}

// oldest is the first connection of the first non-empty tier.
func oldest(tiers *[numTiers]list.List) *pconn {
	for i := range tiers {
		if e := tiers[i].Front(); e != nil {
			return e.Value.(*pconn)
		}
	}
	return nil
}

// move puts pc at the back of tier; false when pc is no longer in the
// table (it gave way to a newcomer, or the listener closed).
func (a *admission) move(pc *pconn, tier int) bool {
	if pc.gone {
		return false
	}
	if pc.tier == tier {
		return true
	}
	ps := a.peers[pc.peer]
	if pc.tier < numTiers {
		a.tiers[pc.tier].Remove(pc.elem)
		ps.tiers[pc.tier].Remove(pc.pelem)
		pc.elem, pc.pelem = nil, nil
	}
	pc.tier = tier
	if tier < numTiers {
		pc.elem = a.tiers[tier].PushBack(pc)
		pc.pelem = ps.tiers[tier].PushBack(pc)
	}
	return true
}

// remove takes pc out of the table, freeing its slots; false when it was
// out already.
func (a *admission) remove(pc *pconn) bool {
	if pc.gone {
		return false
	}
	a.move(pc, tierJudged) // out of the tier lists
	pc.gone = true
	delete(a.all, pc)
	a.n--
	ps := a.peers[pc.peer]
	if ps.n--; ps.n == 0 {
		delete(a.peers, pc.peer)
	}
	return true
}

// counts returns the connections in each tier, for tests.
func (a *admission) counts() (silent, receiving, judged int) {
	silent, receiving = a.tiers[tierSilent].Len(), a.tiers[tierReceiving].Len()
	return silent, receiving, a.n - silent - receiving
}
