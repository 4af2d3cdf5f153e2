package extproc_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/extproc"
	"github.com/zentinelproxy/sidecar/protocol"
)

// handler answers one ProcessingRequest of a stream with the responses to
// send (none: no answer) or an error that ends the stream.
type handler func(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error)

// processor is an ext_proc server built on go-control-plane's generated
// server types; it records every message it receives.
type processor struct {
	extprocsvc.UnimplementedExternalProcessorServer
	handle handler
	// quiet: record nothing (benchmarks, so that GC work stays flat)
	quiet bool

	mu   sync.Mutex
	seen []*extprocsvc.ProcessingRequest
	// The counts are of request streams, those that carried a message;
	// probes counts the streams half-closed without one (the client's
	// readiness probe).
	opened  atomic.Int64
	ended   atomic.Int64 // streams that ended (EOF, cancel or error)
	halfEOF atomic.Int64 // streams the client half-closed
	probes  atomic.Int64
}

func (p *processor) Process(s extprocsvc.ExternalProcessor_ProcessServer) error {
	first := true
	defer func() {
		if !first {
			p.ended.Add(1)
		}
	}()
	for {
		req, err := s.Recv()
		if first && errors.Is(err, io.EOF) {
			p.probes.Add(1)
			return nil
		}
		if first && err == nil {
			first = false
			p.opened.Add(1)
		}
		if errors.Is(err, io.EOF) {
			p.halfEOF.Add(1)
			return nil
		}
		if err != nil {
			return err
		}
		if !p.quiet {
			p.mu.Lock()
			p.seen = append(p.seen, req)
			p.mu.Unlock()
		}
		resps, err := p.handle(req)
		if errors.Is(err, errEndStream) {
			return nil
		}
		if err != nil && !errors.Is(err, errEndAfterSend) {
			return err
		}
		for _, r := range resps {
			if err := s.Send(r); err != nil {
				return err
			}
		}
		if err != nil {
			return nil // errEndAfterSend: answered, then a clean end
		}
	}
}

func (p *processor) received() []*extprocsvc.ProcessingRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]*extprocsvc.ProcessingRequest(nil), p.seen...)
}

// startProcessor serves h on loopback TCP (with TLS when tc is set) and
// returns the processor and its address; stop ends the server at once.
func startProcessor(t testing.TB, h handler, tc *tls.Config) (p *processor, addr string, stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var opts []grpc.ServerOption
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	srv := grpc.NewServer(opts...)
	p = &processor{handle: h}
	extprocsvc.RegisterExternalProcessorServer(srv, p)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	var once sync.Once
	stop = func() { once.Do(func() { srv.Stop(); <-done }) }
	t.Cleanup(stop)
	return p, ln.Addr().String(), stop
}

// newClient connects a Client to addr and waits until it is ready.
func newClient(t testing.TB, addr string, tweak func(*extproc.Config)) *extproc.Client {
	t.Helper()
	cfg := extproc.DefaultConfig("proc", addr)
	cfg.MessageTimeout = 5 * time.Second
	if tweak != nil {
		tweak(&cfg)
	}
	c, err := extproc.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	return c
}

// phaseOf names the phase a ProcessingRequest is about.
func phaseOf(req *extprocsvc.ProcessingRequest) string {
	switch req.GetRequest().(type) {
	case *extprocsvc.ProcessingRequest_RequestHeaders:
		return "request_headers"
	case *extprocsvc.ProcessingRequest_ResponseHeaders:
		return "response_headers"
	case *extprocsvc.ProcessingRequest_RequestBody:
		return "request_body"
	case *extprocsvc.ProcessingRequest_ResponseBody:
		return "response_body"
	}
	return "other"
}

// cont is the plain CONTINUE answer to req's phase, with common applied.
func cont(req *extprocsvc.ProcessingRequest, common *extprocsvc.CommonResponse) *extprocsvc.ProcessingResponse {
	switch req.GetRequest().(type) {
	case *extprocsvc.ProcessingRequest_RequestHeaders:
		return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocsvc.HeadersResponse{Response: common}}}
	case *extprocsvc.ProcessingRequest_ResponseHeaders:
		return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocsvc.HeadersResponse{Response: common}}}
	case *extprocsvc.ProcessingRequest_RequestBody:
		return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_RequestBody{RequestBody: &extprocsvc.BodyResponse{Response: common}}}
	case *extprocsvc.ProcessingRequest_ResponseBody:
		return &extprocsvc.ProcessingResponse{Response: &extprocsvc.ProcessingResponse_ResponseBody{ResponseBody: &extprocsvc.BodyResponse{Response: common}}}
	}
	return &extprocsvc.ProcessingResponse{}
}

// continueAll answers every message with CONTINUE.
func continueAll(req *extprocsvc.ProcessingRequest) ([]*extprocsvc.ProcessingResponse, error) {
	return []*extprocsvc.ProcessingResponse{cont(req, nil)}, nil
}

func hdr(k, v string, action corev3.HeaderValueOption_HeaderAppendAction) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{Header: &corev3.HeaderValue{Key: k, RawValue: []byte(v)}, AppendAction: action}
}

// headerOf returns the raw value of key in a HeaderMap.
func headerOf(hm *corev3.HeaderMap, key string) (string, bool) {
	for _, h := range hm.GetHeaders() {
		if h.GetKey() == key {
			return string(h.GetRawValue()), true
		}
	}
	return "", false
}

func wait() agentmux.Wait { return agentmux.Wait{Deadline: time.Now().Add(10 * time.Second)} }

// waitFor is wait, for scopes where a variable shadows it.
func waitFor() agentmux.Wait { return wait() }

func reqHeaders(hasBody bool, hs ...string) *protocol.RequestHeaders {
	m := &protocol.RequestHeaders{Method: []byte("POST"), URI: []byte("/api/x?q=1"), HasBody: hasBody}
	m.Headers = append(m.Headers, protocol.Header{Name: []byte("host"), Value: []byte("example.com")})
	for i := 0; i+1 < len(hs); i += 2 {
		m.Headers = append(m.Headers, protocol.Header{Name: []byte(hs[i]), Value: []byte(hs[i+1])})
	}
	m.Metadata.ClientIP = []byte("10.0.0.9")
	m.Metadata.ClientPort = 51234
	m.Metadata.CorrelationID = []byte("corr-1")
	m.Metadata.RouteID = []byte("main")
	m.Metadata.UpstreamID = []byte("app")
	return m
}

func chunk(i uint32, data string, last bool) *protocol.BodyChunk {
	return &protocol.BodyChunk{ChunkIndex: i, Data: []byte(data), IsLast: last}
}

// begin opens an exchange on c and registers its Finish.
func begin(t *testing.T, c *extproc.Client) *agentmux.Exchange {
	t.Helper()
	ex, err := c.Begin(wait())
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// opsString renders header operations as "op name=value" lines.
func opsString(ops []protocol.HeaderOp) []string {
	var out []string
	for _, o := range ops {
		s := o.Op.String() + " " + string(o.Name)
		if o.Op != protocol.HeaderRemove {
			s += "=" + string(o.Value)
		}
		out = append(out, s)
	}
	return out
}
