package sdk

import (
	"sync"
	"time"
)

// workerPool runs request handlers on reused goroutines. A handler never
// waits for a free worker: when none is idle a new one starts, so a slow
// request cannot delay a fast one. Idle workers exit after idleTimeout.
type workerPool struct {
	mu   sync.Mutex
	idle []*worker
}

type worker struct {
	task chan task
}

// task is passed by value so that starting a handler allocates nothing.
type task struct {
	d  *Dispatcher
	id uint64
	st *reqState
	ev *Event
}

const idleTimeout = 10 * time.Second

var sharedWorkers = &workerPool{}

func (p *workerPool) run(tk task) {
	p.mu.Lock()
	if n := len(p.idle); n > 0 {
		w := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		w.task <- tk
		return
	}
	p.mu.Unlock()
	w := &worker{task: make(chan task, 1)}
	go p.loop(w, tk)
}

func (p *workerPool) loop(w *worker, tk task) {
	t := time.NewTimer(idleTimeout)
	defer t.Stop()
	for {
		tk.d.run(tk.id, tk.st, tk.ev)
		tk = task{}
		p.mu.Lock()
		p.idle = append(p.idle, w)
		p.mu.Unlock()
		t.Reset(idleTimeout)
		select {
		case tk = <-w.task:
		case <-t.C:
			if !p.retire(w) {
				// Handed a task while retiring: run it.
				tk = <-w.task
				continue
			}
			return
		}
	}
}

// retire removes w from the idle list; false if it was already taken.
func (p *workerPool) retire(w *worker) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.idle {
		if x == w {
			p.idle = append(p.idle[:i], p.idle[i+1:]...)
			return true
		}
	}
	return false
}
