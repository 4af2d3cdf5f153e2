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
	"sync"
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

// logBuffer collects log lines written from several goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitLog waits until the log holds a line containing each of want.
func (b *logBuffer) waitLog(t testing.TB, want ...string) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		s, missing := b.String(), ""
		for _, w := range want {
			if !strings.Contains(s, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no log line containing %q; log:\n%s", missing, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// topLevelKeys returns the keys of the JSON object line in order,
// duplicates included (encoding/json's Unmarshal would hide them).
func topLevelKeys(line []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object (%v, %v)", tok, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, ok := tok.(string)
		if !ok {
			return nil, fmt.Errorf("key is %T", tok)
		}
		keys = append(keys, k)
		// Skip the value, however deeply nested.
		depth := 0
		for {
			tok, err := dec.Token()
			if err != nil {
				return nil, err
			}
			switch tok {
			case json.Delim('{'), json.Delim('['):
				depth++
			case json.Delim('}'), json.Delim(']'):
				depth--
			}
			if depth == 0 {
				break
			}
		}
	}
	return keys, nil
}

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
		keys, err := topLevelKeys(line)
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
	keys, err := topLevelKeys([]byte(`{"a":1,"b":{"a":[1,{"x":2}],"c":"}"},"a":[],"d":null}`))
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
	var logs logBuffer
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
	logs.waitLog(t, "unexpected type", "undecodable reply", "connection lost; reconnecting", "ping timeout")
	c.Close()
	checkLogKeys(t, logs.String(), name)
}
