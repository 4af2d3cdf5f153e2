package grpcclient_test

import (
	"bufio"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/zentinelproxy/sidecar/grpcagent/pb"
	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// TestLogLinesCarryAgentOnce: the logger a transport is given already
// carries the agent field; the client's lines must not add it again.
func TestLogLinesCarryAgentOnce(t *testing.T) {
	var streams atomic.Int32
	a := &rawAgent{}
	a.stream = func(s grpc.BidiStreamingServer[pb.AgentMessage, pb.AgentMessage]) error {
		first := streams.Add(1) == 1
		for {
			m, err := s.Recv()
			if err != nil {
				return nil
			}
			if m.GetRequestHeaders() == nil {
				continue
			}
			// A proxy-only payload (skipped with a warning), the answer,
			// then the first stream ends (the reconnect loop logs it).
			if err := s.Send(&pb.AgentMessage{RequestId: m.RequestId, Payload: &pb.AgentMessage_RequestHeaders{RequestHeaders: &pb.RequestHeaders{}}}); err != nil {
				return err
			}
			if err := s.Send(allow(m.RequestId)); err != nil {
				return err
			}
			if first {
				return errors.New("stream over")
			}
		}
	}
	var logs testutil.LogBuffer
	const name = "dup-agent"
	c := startRaw(t, a, func(cfg *grpcclient.Config) {
		cfg.Name = name
		cfg.Logger = zerolog.New(&logs).With().Str("agent", name).Logger()
		cfg.BackoffMin = 5 * time.Millisecond
		cfg.BackoffMax = 50 * time.Millisecond
	})
	if _, err := roundTrip(t, c, "/"); err != nil && !errors.Is(err, agentmux.ErrAgentConnLost) {
		t.Fatal(err)
	}
	deadline := time.Now().Add(longWait)
	for !strings.Contains(logs.String(), "unexpected type") || !strings.Contains(logs.String(), "lost; reconnecting") {
		if time.Now().After(deadline) {
			t.Fatalf("expected log lines missing:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	_ = c.Close()
	sc := bufio.NewScanner(strings.NewReader(logs.String()))
	for sc.Scan() {
		line := sc.Bytes()
		keys, err := testutil.TopLevelKeys(line)
		if err != nil {
			t.Errorf("line %q: %v", line, err)
			continue
		}
		n := 0
		for i, k := range keys {
			if k == "agent" {
				n++
			}
			for _, k2 := range keys[:i] {
				if k == k2 && k != "agent" {
					t.Errorf("key %q repeated in %s", k, line)
				}
			}
		}
		if n != 1 {
			t.Errorf("key \"agent\" appears %d times in %s", n, line)
		}
	}
}
