package demoagent

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/udsclient"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// TestOverUDS runs the agent behind a real socket and drives it with the
// proxy's UDS client: a block, an allow with headers, and a response body
// whose redacted word is split across chunks.
func TestOverUDS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sock := filepath.Join(t.TempDir(), "demo.sock")
	served := make(chan error, 1)
	actx, stopAgent := context.WithCancel(ctx)
	go func() { served <- sdk.ServeUDS(actx, sock, newDefault(t), &sdk.Options{Name: "demoagent"}) }()
	defer func() {
		stopAgent()
		if err := <-served; err != nil && actx.Err() == nil {
			t.Error(err)
		}
	}()

	c, err := udsclient.NewClient(udsclient.DefaultConfig("demo", sock))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if caps := c.Capabilities(); !caps.HandlesResponseBody || !caps.HandlesRequestHeaders {
		t.Fatalf("capabilities %+v", caps)
	}

	// Blocked.
	ex, err := c.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		t.Fatal(err)
	}
	r, err := ex.RequestHeaders(agentmux.WaitFor(ctx), &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/admin/x")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Decision.Kind != protocol.DecisionBlock || r.Decision.Status != 403 ||
		string(r.Decision.BlockHeaders.Get("x-blocked-by")) != "demoagent" {
		t.Fatalf("decision %+v", r.Decision)
	}
	ex.Finish()

	// Allowed, then a response whose body is redacted across chunks.
	ex, err = c.Begin(agentmux.WaitFor(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer ex.Finish()
	rh := &protocol.RequestHeaders{Method: []byte("GET"), URI: []byte("/")}
	rh.Headers = rh.Headers.Add([]byte("user-agent"), []byte("curl/8"))
	if r, err = ex.RequestHeaders(agentmux.WaitFor(ctx), rh); err != nil {
		t.Fatal(err)
	}
	if r.Decision.Kind != protocol.DecisionAllow || len(r.Decision.RequestHeaderOps) != 2 {
		t.Fatalf("decision %+v", r.Decision)
	}
	resp := &protocol.ResponseHeaders{StatusCode: 200, HasBody: true}
	resp.Headers = resp.Headers.Add([]byte("content-type"), []byte("text/plain"))
	if r, err = ex.ResponseHeaders(agentmux.WaitFor(ctx), resp); err != nil {
		t.Fatal(err)
	}
	chunks := []string{"top sec", "ret, ", "nothing here, ", "SECRET"}
	var out bytes.Buffer
	for i, s := range chunks {
		m := &protocol.BodyChunk{ChunkIndex: uint32(i), Data: []byte(s), IsLast: i == len(chunks)-1, TotalSize: -1, Progress: -1}
		r, err := ex.BodyChunk(agentmux.WaitFor(ctx), protocol.PhaseResponse, m)
		if err != nil {
			t.Fatal(err)
		}
		if r.Type != protocol.TypeBodyMutation {
			t.Fatalf("chunk %d: reply %s", i, r.Type)
		}
		switch r.Mutation.Action {
		case protocol.MutationPass:
			out.WriteString(s)
		case protocol.MutationReplace:
			out.Write(r.Mutation.Data)
		}
	}
	if want := "top ******, nothing here, ******"; out.String() != want {
		t.Fatalf("body %q, want %q", out.String(), want)
	}
}
