package grpcwire

import (
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/mem"

	"github.com/zentinelproxy/sidecar/protocol"
)

// recordingStream stands for a stream's SendMsg: it marshals each message
// with the codec, as gRPC does, records its request id and frees it.
type recordingStream struct {
	mu   sync.Mutex
	ids  []uint64
	sent chan struct{}
}

func (r *recordingStream) send(m any) error {
	data, err := Codec().Marshal(m)
	if err != nil {
		return err
	}
	var f Frame
	f.Parse(data.Materialize())
	data.Free()
	r.mu.Lock()
	r.ids = append(r.ids, f.RequestID)
	r.mu.Unlock()
	if r.sent != nil {
		r.sent <- struct{}{}
	}
	return nil
}

func (r *recordingStream) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids)
}

// TestOutboxSendEventDirect: an event that finds the Outbox idle is sent
// by the caller (before SendEvent returns, with Run not even started);
// once the bytes not proven read reach the bound, events are queued for
// Run, and an answer lets the next one go directly again.
func TestOutboxSendEventDirect(t *testing.T) {
	st := &recordingStream{}
	o := NewOutbox(st.send, 0, 16)
	big := &protocol.RequestHeaders{Method: []byte("GET"), URI: make([]byte, 1000)}
	id := uint64(0)
	for o.enq+1100 < directQuota {
		id++
		big.RequestID = id
		if err := o.SendEvent(id, big); err != nil {
			t.Fatal(err)
		}
		if st.count() != int(id) {
			t.Fatalf("event %d was not sent directly", id)
		}
	}
	id++
	big.RequestID = id
	if err := o.SendEvent(id, big); err != nil {
		t.Fatal(err)
	}
	id++
	big.RequestID = id
	if err := o.SendEvent(id, big); err != nil {
		t.Fatal(err)
	}
	if n := st.count(); n != int(id-1) && n != int(id-2) {
		t.Fatalf("%d of %d events sent with the quota unproven", n, id)
	}
	if len(o.q) == 0 {
		t.Fatal("nothing queued with the quota unproven")
	}
	done := make(chan error, 1)
	go func() { done <- o.Run() }()
	deadline := time.Now().Add(10 * time.Second)
	for st.count() != int(id) {
		if time.Now().After(deadline) {
			t.Fatal("Run did not send the queued events")
		}
		time.Sleep(time.Millisecond)
	}
	o.Drain(10 * time.Second)
	o.Answered(id) // the peer read the last one: everything before it left
	id++
	big.RequestID = id
	if err := o.SendEvent(id, big); err != nil {
		t.Fatal(err)
	}
	if st.count() != int(id) {
		t.Fatal("an event after the answer was not sent directly")
	}
	o.Close(nil)
	<-done
	for i, got := range st.ids {
		if got != uint64(i+1) {
			t.Fatalf("sent out of order: %v", st.ids)
		}
	}
}

// TestOutboxPutNeverSendsDirectly: Put (a read loop's Pongs) only queues.
func TestOutboxPutNeverSendsDirectly(t *testing.T) {
	st := &recordingStream{}
	o := NewOutbox(st.send, 0, 16)
	if err := o.Put(&protocol.CancelRequest{RequestID: 3}); err != nil {
		t.Fatal(err)
	}
	if st.count() != 0 || len(o.q) != 1 {
		t.Fatal("Put sent from the caller's goroutine")
	}
	o.Close(nil)
}

// TestSmallBufsRecycleSlice: a small message's one-element BufferSlice is
// stored with its pooled bytes and is cleared when gRPC frees the buffer.
func TestSmallBufsRecycleSlice(t *testing.T) {
	var m Outgoing
	if err := m.Encode(&protocol.CancelRequest{RequestID: 9, Reason: []byte("timeout")}, 0); err != nil {
		t.Fatal(err)
	}
	sb := m.small
	if sb == nil {
		t.Fatal("a small message did not use the small buffers")
	}
	data, err := Codec().Marshal(&m)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 1 || &data[0] != &sb.bs[0] {
		t.Fatal("Marshal did not hand out the pooled slice")
	}
	var f Frame
	f.Parse(data.Materialize())
	if f.RequestID != 9 || f.Payload != PayloadCancel {
		t.Fatalf("decoded %+v", f)
	}
	data.Free()
	if sb.bs[0] != nil {
		t.Fatal("the slice still holds the freed buffer")
	}
	var _ mem.BufferPool = &smallBufs
}
