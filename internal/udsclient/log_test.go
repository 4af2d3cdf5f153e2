package udsclient_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/internal/testutil/testagent"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// checkLogKeys fails unless every line of log is a JSON object without
// duplicate keys whose "agent" is name.
func checkLogKeys(t testing.TB, log, name string) {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(log))
	lines := 0
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		lines++
		keys, err := testutil.TopLevelKeys(line)
		if err != nil {
			t.Errorf("line %q: %v", line, err)
			continue
		}
		seen := map[string]int{}
		for _, k := range keys {
			seen[k]++
		}
		for k, n := range seen {
			if n > 1 {
				t.Errorf("key %q appears %d times in %s", k, n, line)
			}
		}
		if seen["agent"] == 0 {
			t.Errorf("no key \"agent\" in %s", line)
		}
		if seen["agent"] != 1 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil || m["agent"] != name {
			t.Errorf("agent = %v (%v) in %s", m["agent"], err, line)
		}
	}
	if lines == 0 {
		t.Error("no log lines")
	}
}

func TestTopLevelKeys(t *testing.T) {
	keys, err := testutil.TopLevelKeys([]byte(`{"a":1,"b":{"a":[1,{"x":2}],"c":"}"},"a":[],"d":null}`))
	if err != nil || strings.Join(keys, ",") != "a,b,a,d" {
		t.Fatalf("keys %v, err %v", keys, err)
	}
}

// TestLogLinesCarryAgentOnce: the logger a transport is given already
// carries the agent field (the dataplane adds it); the transport's own
// lines, its link's and its reconnect loop's must not add it again.
func TestLogLinesCarryAgentOnce(t *testing.T) {
	path := testutil.SocketPath(t)
	var conn atomic.Int64
	testagent.Raw(t, path, allCaps, func(nc net.Conn, fr *uds.FrameReader) {
		first := conn.Add(1) == 1
		for {
			typ, p, err := fr.Next()
			if err != nil {
				return
			}
			if !first {
				continue // later connections stay silent: ping timeout
			}
			switch typ {
			case protocol.TypePing:
				var ping protocol.Ping
				_ = ping.Decode(p)
				_ = uds.WriteFrame(nc, (*protocol.Pong)(&ping))
			case protocol.TypeRequestHeaders:
				id, _ := protocol.PeekRequestID(p)
				// A frame of unknown type, then an undecodable reply
				// for the request, then the connection ends.
				b, _ := uds.AppendRawFrame(nil, 0x77, []byte(`{}`))
				b, _ = uds.AppendRawFrame(b, protocol.TypeDecision, fmt.Appendf(nil, `{"request_id":%d,"decision":"explode"}`, id))
				_, _ = nc.Write(b)
				return
			}
		}
	})
	var logs testutil.LogBuffer
	const name = "dup-agent"
	log := zerolog.New(&logs).With().Str("agent", name).Logger()
	c := newClient(t, path, func(cfg *udsclient.Config) {
		cfg.Name = name
		cfg.Logger = log
		cfg.PingInterval = 20 * time.Millisecond
		cfg.PingTimeout = 100 * time.Millisecond
	})
	if _, err := roundTrip(context.Background(), c, headers()); !errors.Is(err, agentmux.ErrAgentProtocol) && !errors.Is(err, agentmux.ErrAgentConnLost) {
		t.Fatalf("err = %v", err)
	}
	logs.WaitLog(t, "unexpected type", "undecodable reply", "connection lost; reconnecting", "ping timeout")
	c.Close()
	checkLogKeys(t, logs.String(), name)
}
