// Package extproc runs Envoy External Processing servers
// (envoy.service.ext_proc.v3.ExternalProcessor) as agents: the proxy is
// the ext_proc client, one Process stream per HTTP request over a pool of
// HTTP/2 connections.
//
// The transport is an agentmux.Link: the dataplane drives the same
// exchanges as for every agent, and each event is mapped onto a
// ProcessingRequest of its request's stream; each ProcessingResponse is
// mapped back onto a protocol.Decision, so that Decision.Normalize and the
// dataplane's rules and limits apply to a processor's mutations exactly
// as to any agent's. Phases the request's processing mode does not send
// are answered by the link itself, without the network. Where a processor
// can tell, the mapping is Envoy's ext_proc filter's (header mutations,
// metadata_context, attributes, the failure statuses), each rule citing
// the Envoy behaviour it follows. A connection carries requests only once
// its server has answered a probe as an ExternalProcessor (Client.probe).
// See docs/transports.md for the field-by-field mapping.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocsvc "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/grpcclient"
	"github.com/zentinelproxy/sidecar/internal/grpckeep"
	"github.com/zentinelproxy/sidecar/protocol"
)

// event indexes the transport's own counters.
type event int

const (
	evStreams event = iota
	evImmediate
	evClearRouteCache
	evOverride
	evOverrideRefused
	evIgnored
	evUnsupported
	evWrongPhase
	evUnsolicited
	evStreamClosed
	evBufferLimit
	evProcessorDone
	evProbeRefused
	numEvents
)

// EventNames are the labels of the transport's counters, by event.
var EventNames = [numEvents]string{
	"streams_opened", "immediate_responses", "clear_route_cache_ignored",
	"mode_overrides", "mode_overrides_refused", "fields_ignored",
	"unsupported_responses", "wrong_phase", "unsolicited", "stream_closed",
	"buffer_limit", "processor_done", "probes_refused",
}

var _ agentmux.Reporter = (*Client)(nil)

// Client keeps Conns HTTP/2 connections to one processor and implements
// agentmux.Agent: each connection is an agentmux.Session whose link opens
// one stream per request. Its report (Snapshot) adds the transport's
// events to its pool's.
type Client struct {
	*agentmux.Pool
	cfg  Config
	caps protocol.Capabilities
	// metadata is the metadata_context of every message, built once and
	// shared (never modified; concurrent marshaling is safe).
	metadata *corev3.Metadata
	conns    []*grpc.ClientConn
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	log      zerolog.Logger

	counts [numEvents]atomic.Uint64
}

func (c *Client) count(e event) { c.counts[e].Add(1) }

// Counts returns the transport's counters by EventNames.
func (c *Client) Counts() map[string]uint64 {
	out := make(map[string]uint64, numEvents)
	for i := range c.counts {
		out[EventNames[i]] = c.counts[i].Load()
	}
	return out
}

// Snapshot implements agentmux.Reporter: the pool's connections and
// counters, and the transport's events (Counts), which internal/metrics
// exports as sidecar_extproc_events_total.
func (c *Client) Snapshot() agentmux.AgentStatus {
	st := c.Pool.Snapshot()
	st.Events = c.Counts()
	return st
}

// Capabilities are what the processor may be sent under the configured
// mode and every override the configuration allows: the phases no
// request's mode sends are not offered to it at all.
func (c *Config) Capabilities() protocol.Capabilities {
	modes, bounded := c.possibleModes()
	caps := protocol.Capabilities{
		HandlesRequestHeaders: sends(c.Mode.RequestHeader, true),
		// Cancels end the request's stream; they never reach the wire.
		SupportsCancellation: true,
	}
	if !bounded {
		caps.HandlesResponseHeaders, caps.HandlesRequestBody, caps.HandlesResponseBody, caps.SupportsStreaming = true, true, true, true
		return caps
	}
	for _, m := range modes {
		caps.HandlesResponseHeaders = caps.HandlesResponseHeaders || sends(m.ResponseHeader, true)
		caps.HandlesRequestBody = caps.HandlesRequestBody || m.RequestBody != extprocfilter.ProcessingMode_NONE
		caps.HandlesResponseBody = caps.HandlesResponseBody || m.ResponseBody != extprocfilter.ProcessingMode_NONE
		caps.SupportsStreaming = caps.SupportsStreaming ||
			m.RequestBody == extprocfilter.ProcessingMode_STREAMED || m.ResponseBody == extprocfilter.ProcessingMode_STREAMED
	}
	return caps
}

// metadataContext builds the metadata_context of the configured metadata
// (an empty one without: Envoy always sets the field).
func metadataContext(md map[string]map[string]string) *corev3.Metadata {
	out := &corev3.Metadata{}
	if len(md) == 0 {
		return out
	}
	out.FilterMetadata = make(map[string]*structpb.Struct, len(md))
	for ns, kv := range md {
		s := &structpb.Struct{Fields: make(map[string]*structpb.Value, len(kv))}
		for k, v := range kv {
			s.Fields[k] = structpb.NewStringValue(v)
		}
		out.FilterMetadata[ns] = s
	}
	return out
}

// NewClient validates cfg, reads its TLS files and starts connecting;
// Begin fails with agentmux.ErrAgentUnavailable until a connection is up.
func NewClient(cfg Config) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	creds, err := grpcclient.Credentials(&cfg.TLS)
	if err != nil {
		return nil, fmt.Errorf("%w: agent %q: %v", ErrExtProcConfig, cfg.Name, err)
	}
	// The dial options of transport grpc, with gRPC's default backoff, its
	// credentials over raw sockets (rawCreds), and the streams' own codec.
	metadata := metadataContext(cfg.Metadata)
	opts := append(grpcclient.DialOptionsWith(rawCreds{creds}, cfg.MaxMessageSize, cfg.DialTimeout,
		backoff.DefaultConfig.BaseDelay, backoff.DefaultConfig.MaxDelay, "zentinel-sidecar/0.1 ext_proc"),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(newCodec(metadata))))
	ctx, cancel := context.WithCancel(context.Background())
	c := &Client{
		Pool:   agentmux.NewPool(cfg.Name, "ext_proc"),
		cfg:    cfg,
		caps:   cfg.Capabilities(),
		ctx:    ctx,
		cancel: cancel,
		log:    cfg.Logger.With().Str("address", cfg.Address).Logger(),
	}
	c.metadata = metadata
	if c.conns, err = grpcclient.NewClientConns(cfg.Address, cfg.Conns, opts); err != nil {
		cancel()
		return nil, fmt.Errorf("%w: agent %q: address %q: %v", ErrExtProcConfig, cfg.Name, cfg.Address, err)
	}
	for i := range c.conns {
		c.wg.Add(1)
		go c.maintain(i)
	}
	return c, nil
}

// ErrNotProcessor: the server at the agent's address does not implement
// envoy.service.ext_proc.v3.ExternalProcessor.
var ErrNotProcessor = errors.New("extproc: the server does not implement envoy.service.ext_proc.v3.ExternalProcessor")

// probe asks the server whether it implements ExternalProcessor, before
// any request depends on it: a Process stream half-closed at once,
// without a message. A server without the service refuses the stream
// with Unimplemented; a processor sees its stream end without a request
// and ends it (or keeps it until the probe's deadline): either way it
// answers to the service. Nothing reaches a processor's logic but an empty
// stream, unlike a probe request (which a processor would process).
func (c *Client) probe(cli extprocsvc.ExternalProcessorClient) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.DialTimeout)
	defer cancel()
	s, err := cli.Process(ctx)
	if err == nil {
		if err = s.CloseSend(); err == nil {
			_, err = s.Recv()
		}
	}
	switch status.Code(err) {
	case codes.Unimplemented:
		return fmt.Errorf("%w: %v", ErrNotProcessor, rpcError(err))
	case codes.Unavailable, codes.Canceled:
		// The connection went away meanwhile: maintain sees it.
		if c.ctx.Err() == nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("probe: %v", rpcError(err))
		}
	}
	return nil
}

// maintain keeps connection slot's session in the pool while the
// connection is usable (grpckeep).
func (c *Client) maintain(slot int) {
	defer c.wg.Done()
	cc := c.conns[slot]
	cli := extprocsvc.NewExternalProcessorClient(cc)
	grpckeep.Keep(c.ctx, cc, grpckeep.Conn{
		Pool: c.Pool, What: "processor", Address: c.cfg.Address,
		Log:       c.log.With().Int("conn", slot).Logger(),
		Probe:     func() error { return c.probe(cli) },
		Refused:   ErrNotProcessor,
		OnRefused: func() { c.count(evProbeRefused) },
		NewSession: func() *agentmux.Session {
			l := newLink(c, cli)
			sess := agentmux.NewSession(l, c.caps, agentmux.SessionConfig{
				Name:           c.cfg.Name,
				MaxInFlight:    c.cfg.MaxInFlight,
				MaxQueue:       c.cfg.MaxQueue,
				MessageTimeout: c.cfg.MessageTimeout,
			})
			l.sess = sess
			return sess
		},
	})
}

// Close ends every stream and closes the connections.
func (c *Client) Close() error {
	err := c.Pool.Close()
	c.cancel()
	c.wg.Wait()
	for _, cc := range c.conns {
		_ = cc.Close()
	}
	return err
}
