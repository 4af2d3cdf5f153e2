package reverse

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
)

// TestStalledFrameFromAgent: an agent that starts a frame and stalls
// loses its registered connection after the frame timeout (the ping
// timeout is far away), failing the request waiting on it.
func TestStalledFrameFromAgent(t *testing.T) {
	cfg := testConfig(t)
	cfg.MessageTimeout = time.Minute
	cfg.PingInterval = 10 * time.Second
	cfg.PingTimeout = 30 * time.Second
	cfg.Agents[0].FrameTimeout = 300 * time.Millisecond
	l := startListener(t, cfg)
	c := dialRaw(t, "unix", cfg.UnixPath)
	c.send(protocol.TypeRegistrationRequest, regReq("waf-1", testToken))
	if _, r := c.answer(); !r.Accepted {
		t.Fatal(r.Error)
	}
	a := l.Agent("waf")
	testutil.WaitFor(t, "in pool", func() bool { return a.Snapshot().Connections == 1 })
	errc := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), a)
		errc <- err
	}()
	if typ, _, err := c.fr.Next(); err != nil || typ != protocol.TypeRequestHeaders {
		t.Fatalf("request: %v %v", typ, err)
	}
	stall := binary.BigEndian.AppendUint32(nil, 1<<20)
	stall = append(stall, byte(protocol.TypeDecision))
	c.sendRaw(append(stall, bytes.Repeat([]byte(" "), 100)...))
	// dialRaw's 10s deadline is a third of the ping timeout.
	c.closed()
	select {
	case err := <-errc:
		if !errors.Is(err, agentmux.ErrAgentConnLost) || !strings.Contains(err.Error(), "stalled mid-frame") {
			t.Fatalf("request: %v, want ErrAgentConnLost naming the stalled frame", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("request still waiting")
	}
	testutil.WaitFor(t, "stall counted", func() bool { return a.Snapshot().Protocol == 1 })
}
