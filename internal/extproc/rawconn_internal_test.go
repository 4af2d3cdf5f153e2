package extproc

import (
	"context"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/rawio"
	"github.com/zentinelproxy/sidecar/internal/testutil"
)

// The connection gRPC gets from the credentials of a plaintext agent is
// the dialled socket read and written by raw system calls; the bytes
// still flow both ways.
func TestRawCredsWrapSocket(t *testing.T) {
	inner, err := grpcclient.Credentials(&grpcclient.TLSConfig{})
	if err != nil {
		t.Fatal(err)
	}
	creds := rawCreds{inner}
	dialed, accepted := testutil.ConnPair(t, "tcp")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, _, err := creds.ClientHandshake(ctx, "proc", dialed)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := conn.(*rawio.Conn); !ok {
		t.Fatalf("handshake returned %T, want *rawio.Conn", conn)
	}
	if _, ok := creds.Clone().(rawCreds); !ok {
		t.Fatalf("Clone returned %T, want rawCreds", creds.Clone())
	}
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	_ = accepted.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 4)
	if _, err := accepted.Read(b); err != nil || string(b) != "ping" {
		t.Fatalf("peer read %q, %v", b, err)
	}
	if _, err := accepted.Write([]byte("pong")); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Read(b); err != nil || string(b) != "pong" {
		t.Fatalf("read %q, %v", b, err)
	}
}
