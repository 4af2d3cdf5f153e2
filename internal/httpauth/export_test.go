package httpauth

// LeaderBatch is for a yield hook, with the owner the hook was given: ok
// reports whether owner is a connection pool, and size how many
// subrequests the yielding leader's batch holds so far. The leader
// yields right after making its batch the forming one, and only a full
// batch is replaced, so the one forming when the hook starts is its own.
func LeaderBatch(owner any) (size func() int, ok bool) {
	p, ok := owner.(*connPool)
	if !ok {
		return nil, false
	}
	p.mu.Lock()
	b := p.forming
	p.mu.Unlock()
	return func() int {
		if b == nil {
			return 0
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(b.calls)
	}, true
}
