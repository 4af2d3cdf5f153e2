package corazawaf

import (
	"container/list"
	"sync"
	"time"

	"github.com/corazawaf/coraza/v3/types"
)

// entry is one request's open Coraza transaction.
type entry struct {
	id    uint64
	tx    types.Transaction
	proto string // the request's HTTP version, for ProcessResponseHeaders
	// phase2 is set once the request body phase (CRS phase 2) ran.
	phase2 bool
	seen   time.Time
	elem   *list.Element
}

// table holds the transactions between the events of their request: a
// transaction is taken out while a handler works on it, so that eviction
// never closes one in use, and put back when more events are expected.
// Every transaction is closed exactly once: by the handler that finishes
// it, or by the table when it evicts, expires or shuts down.
type table struct {
	max   int
	ttl   time.Duration
	stats *counters

	mu     sync.Mutex
	byID   map[uint64]*entry
	order  list.List // oldest first
	swept  time.Time
	closed bool
}

func newTable(max int, ttl time.Duration, st *counters) *table {
	return &table{max: max, ttl: ttl, stats: st, byID: make(map[uint64]*entry)}
}

// take removes and returns id's entry, or nil.
func (t *table) take(id uint64) *entry {
	t.mu.Lock()
	defer t.mu.Unlock()
	e := t.byID[id]
	if e != nil {
		delete(t.byID, id)
		t.order.Remove(e.elem)
		e.elem = nil
	}
	return e
}

// put stores e until its next event. Past the bound the oldest entries are
// closed; after shutdown e itself is.
func (t *table) put(e *entry, now time.Time) {
	var drop []*entry
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		closeTx(e.tx, t.stats)
		return
	}
	if old := t.byID[e.id]; old != nil {
		// Two proxies (ids are unique per proxy process) with the same id:
		// the older conversation loses its transaction.
		delete(t.byID, old.id)
		t.order.Remove(old.elem)
		drop = append(drop, old)
	}
	if now.Sub(t.swept) >= t.ttl/4 {
		t.swept = now
		for f := t.order.Front(); f != nil; f = t.order.Front() {
			o := f.Value.(*entry)
			if now.Sub(o.seen) < t.ttl {
				break
			}
			t.order.Remove(f)
			delete(t.byID, o.id)
			drop = append(drop, o)
			t.stats.expired.Add(1)
		}
	}
	for len(t.byID) >= t.max {
		f := t.order.Front()
		o := f.Value.(*entry)
		t.order.Remove(f)
		delete(t.byID, o.id)
		drop = append(drop, o)
		t.stats.evicted.Add(1)
	}
	e.seen = now
	e.elem = t.order.PushBack(e)
	t.byID[e.id] = e
	t.mu.Unlock()
	for _, o := range drop {
		closeTx(o.tx, t.stats)
	}
}

// len is the number of stored entries.
func (t *table) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}

// close closes every stored transaction; later puts close theirs.
func (t *table) close() {
	t.mu.Lock()
	t.closed = true
	all := make([]*entry, 0, len(t.byID))
	for _, e := range t.byID {
		all = append(all, e)
	}
	clear(t.byID)
	t.order.Init()
	t.mu.Unlock()
	for _, e := range all {
		closeTx(e.tx, t.stats)
	}
}

// closeTx ends a transaction: the logging phase, then Close, which returns
// it to Coraza's pool (and removes any upload temp files).
func closeTx(tx types.Transaction, st *counters) {
	tx.ProcessLogging()
	_ = tx.Close()
	st.open.Add(-1)
}
