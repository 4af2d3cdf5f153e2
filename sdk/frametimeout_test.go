package sdk_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// hangGuard bounds waits for what must happen promptly; it is a liveness
// bound, not a speed assertion.
const hangGuard = 10 * time.Second

// stalledFrame is the start of a RequestHeaders frame announcing 1 MiB:
// its header and 100 bytes, after which the proxy stalls.
func stalledFrame() []byte {
	b := binary.BigEndian.AppendUint32(nil, 1<<20)
	b = append(b, byte(protocol.TypeRequestHeaders))
	return append(b, bytes.Repeat([]byte(" "), 100)...)
}

func tempSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "sdkft")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "a.sock")
}

// expectClosed reads nc until the agent closes it; a read that runs into
// the hang guard means the agent is still waiting for the stalled frame.
func expectClosed(t *testing.T, nc net.Conn, fr *uds.FrameReader) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(hangGuard))
	for {
		_, _, err := fr.Next()
		if err == nil {
			continue
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("agent still holds a connection stalled mid-frame: %v", err)
		}
		return
	}
}

// TestServeStalledFrameFromProxy: a proxy that stalls mid-frame loses the
// connection after the agent's frame timeout.
func TestServeStalledFrameFromProxy(t *testing.T) {
	path := tempSocket(t)
	ln, err := sdk.ListenUDS(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- sdk.Serve(ctx, ln, sdk.Base{Caps: protocol.Capabilities{HandlesRequestHeaders: true}},
			&sdk.Options{FrameTimeout: 200 * time.Millisecond})
	}()
	t.Cleanup(func() { cancel(); <-done })
	nc, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	fr, _, err := udsclient.ClientHandshake(nc, "stalling-proxy", hangGuard)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Write(stalledFrame()); err != nil {
		t.Fatal(err)
	}
	expectClosed(t, nc, fr)
}

// TestReverseStalledFrameFromProxy: the same over a reverse connection,
// whose idle timeout (far longer here) must not push the frame's deadline
// out; the agent reconnects.
func TestReverseStalledFrameFromProxy(t *testing.T) {
	path := tempSocket(t)
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	serveReverse(t, sdk.ReverseConfig{
		Address: path, AgentID: "waf-1", Token: "t",
		IdleTimeout:  time.Minute,
		FrameTimeout: 200 * time.Millisecond,
		BackoffMin:   time.Millisecond, BackoffMax: 10 * time.Millisecond,
	})
	for i := 0; i < 2; i++ {
		_ = ln.(*net.UnixListener).SetDeadline(time.Now().Add(hangGuard))
		nc, err := ln.Accept()
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		defer nc.Close()
		fr := uds.NewFrameReader(nc)
		_ = nc.SetDeadline(time.Now().Add(hangGuard))
		if typ, _, err := fr.Next(); err != nil || typ != protocol.TypeRegistrationRequest {
			t.Fatalf("registration: %v %v", typ, err)
		}
		if err := uds.WriteFrame(nc, &protocol.RegistrationResponse{Accepted: true, AssignedID: "c1"}); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			break // it came back
		}
		if _, err := nc.Write(stalledFrame()); err != nil {
			t.Fatal(err)
		}
		expectClosed(t, nc, fr)
	}
}
