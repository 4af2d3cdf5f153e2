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
	// phase2 is set once the request body phase (CRS phase 2) ran,
	// response once the response phases started, logged once the
	// logging phase (5) ran.
	phase2, response, logged bool
	seen                     time.Time
	elem                     *list.Element
}

// logPhase runs the transaction's logging phase (CRS's phase 5: its
// anomaly score summary, 980170) unless it ran: just before the answer
// that ends the transaction, so that the answer reports it.
func (e *entry) logPhase() {
	if !e.logged {
		e.logged = true
		e.tx.ProcessLogging()
	}
}

// table holds the transactions between the events of their request: a
// transaction is taken out while a handler works on it, so that eviction
// never closes one in use, and put back when more events are expected.
// Every transaction is closed exactly once: by the handler that finishes
// it, or by the table when it evicts, expires or shuts down, which hands
// it to drop (with the reason) to be logged and closed.
type table struct {
	max   int
	ttl   time.Duration
	stats *counters
	drop  func(e *entry, reason string)

	mu     sync.Mutex
	byID   map[uint64]*entry
	order  list.List // oldest first
	swept  time.Time
	closed bool
}

func newTable(max int, ttl time.Duration, st *counters, drop func(*entry, string)) *table {
	return &table{max: max, ttl: ttl, stats: st, drop: drop, byID: make(map[uint64]*entry)}
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
	type dropped struct {
		e      *entry
		reason string
	}
	var drop []dropped
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		t.drop(e, reasonShutdown)
		return
	}
	var replaced *entry
	if old := t.byID[e.id]; old != nil {
		// Two proxies (ids are unique per proxy process) with the same id:
		// the older conversation loses its transaction.
		delete(t.byID, old.id)
		t.order.Remove(old.elem)
		replaced = old
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
			drop = append(drop, dropped{o, reasonExpired})
			t.stats.expired.Add(1)
		}
	}
	for len(t.byID) >= t.max {
		f := t.order.Front()
		o := f.Value.(*entry)
		t.order.Remove(f)
		delete(t.byID, o.id)
		drop = append(drop, dropped{o, reasonEvicted})
		t.stats.evicted.Add(1)
	}
	e.seen = now
	e.elem = t.order.PushBack(e)
	t.byID[e.id] = e
	t.mu.Unlock()
	if replaced != nil {
		closeEntry(replaced, t.stats)
	}
	for _, o := range drop {
		t.drop(o.e, o.reason)
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
		t.drop(e, reasonShutdown)
	}
}

// closeEntry ends e's transaction: the logging phase unless it ran, then
// Close, which returns it to Coraza's pool (and removes any upload temp
// files).
func closeEntry(e *entry, st *counters) {
	e.logPhase()
	_ = e.tx.Close()
	st.open.Add(-1)
}
