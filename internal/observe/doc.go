// Package observe is the vocabulary between the dataplane and what
// watches it: the events of the request path (Observer, with the
// Outcome of each agent event), the summary of each finished request
// (RequestSummary, RequestOutcome, RequestRecorder), the phase indices
// they share, and the snapshots the dataplane's status methods return
// (Stats, PolicyStatus, UpstreamStatus, TracingStats and their parts).
//
// It holds types only, and no dependency beyond the protocol: the
// metrics (internal/metrics) and the access log (internal/accesslog)
// implement and read it without linking the proxy, and the dataplane
// package re-exports every name (type aliases), so its users need not
// import this one.
//
// The contract of an Observer: its methods are called on the request's
// goroutine, must not block, and get route and agent indices into the
// names of the last Reset, which keep their meaning across reloads. A
// RequestSummary is owned by the dataplane and valid only during the
// RecordRequest call.
package observe
