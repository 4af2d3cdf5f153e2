package sdk

import "github.com/zentinelproxy/sidecar/internal/schedpolicy"

// SetBatchScheduling puts every thread of the agent's process, and the
// threads it starts later, under Linux's SCHED_BATCH policy; call it at
// the start of main. No privilege is needed.
//
// Use it when the agent shares a core with the sidecar (a pod limited to
// one CPU, processes pinned together). Under the default policy each
// event the sidecar writes wakes the agent, which preempts the sidecar
// mid-request; under SCHED_BATCH the agent waits until the sidecar blocks
// and then answers everything queued at once. On the peer benchmark (the
// sidecar and an agent on this SDK sharing one core) this alone took the
// context switches from 0.29 to 0.05 per request and the CPU of the two
// from 43.1 to 34.7 µs per request, the sidecar staying under the default
// policy (docs/performance.md).
//
// The trade-off: on a core shared with unrelated busy work, an event
// waits for the end of that work's time slice (a few milliseconds at
// most) instead of being answered at once. On other systems it returns an
// error and changes nothing.
func SetBatchScheduling() error { return schedpolicy.SetBatch() }

// oneCPU reports whether the agent may run on one CPU only, where
// ServeConn yields on wake-ups (Options.NoYieldOnWake); a variable for
// tests.
var oneCPU = schedpolicy.OneCPU
