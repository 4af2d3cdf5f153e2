package sdk

// CancelObserver is an optional interface of a Handler that keeps state
// for a request between its events (a transaction held from a request's
// headers to its response's, say). The proxy sends nothing more for a
// request it gave up on, only a CancelRequest, and that reaches a
// handler's context only while one of the request's events is being
// handled; OnCancel tells the handler in every case, so that it can drop
// the state at once instead of waiting for it to expire.
//
// OnCancel is called for each CancelRequest, and for each request with an
// event in progress when CancelAll arrives or the connection ends, after
// the context of a running handler of that request was canceled; and for
// each event the SDK drops because its deadline (the proxy's timeout_ms)
// passed before a handler could start on it, since the proxy has then
// given up on its request. It runs on the connection's read loop (or the
// goroutine that found the event expired): it must return quickly and
// never block.
// It may be called for a request the handler does not know (already
// answered in full, or whose events never came), and concurrently with a
// handler of that request that has not yet seen its context end.
type CancelObserver interface {
	OnCancel(requestID uint64)
}
