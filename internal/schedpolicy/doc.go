// Package schedpolicy sets the Linux scheduling policy of the whole
// process, for the sidecar (run -sched batch) and for agents on the Go SDK
// (sdk.SetBatchScheduling), and tells whether the process is confined to
// one CPU (OneCPU), where an SDK agent yields on wake-ups.
//
// SCHED_BATCH takes away wake-up preemption: a process that wakes waits
// for the running task to block or end its slice instead of preempting
// it. When the sidecar and an agent share a core, each wake-up of one by
// the other otherwise costs a context switch; under SCHED_BATCH each side
// handles everything queued before the other runs.
package schedpolicy
