package agentcheck

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/uds"
)

// env is one run: how to reach the agent, and what the checks learnt.
type env struct {
	cfg    *Config
	ctx    context.Context
	report *Report

	// reverse: the listener, the connections it accepted, and the
	// registered connection kept between checks that leave it usable.
	ln       net.Listener
	accepted chan net.Conn
	cur      *framedLink

	// what the setup said, for the handshake or registration check.
	setupSent, setupRecv []string
	setupErr             error
	setupNote            []string
	agentName            string

	// first is the reverse agent's first connection, taken by reach and
	// handed to the first check that waits for one.
	first   net.Conn
	firstAt time.Time

	pingRTT time.Duration
	// strays are the agent's answers to requests never sent (see strays).
	strays *strays
}

func newEnv(ctx context.Context, cfg *Config) (*env, error) {
	e := &env{cfg: cfg, ctx: ctx, strays: newStrays()}
	if cfg.Transport == TransportReverse {
		network := "tcp"
		if strings.Contains(cfg.Address, "/") {
			network = "unix"
			// A socket file left by an earlier run would make Listen fail.
			if fi, err := os.Lstat(cfg.Address); err == nil && fi.Mode()&os.ModeSocket != 0 {
				_ = os.Remove(cfg.Address)
			}
		}
		ln, err := net.Listen(network, cfg.Address)
		if err != nil {
			return nil, fmt.Errorf("%w: listen: %v", ErrConfig, err)
		}
		e.ln = ln
		e.accepted = make(chan net.Conn, 64)
		go func() {
			for {
				nc, err := ln.Accept()
				if err != nil {
					close(e.accepted)
					return
				}
				select {
				case e.accepted <- nc:
				default:
					_ = nc.Close() // nobody waits for that many
				}
			}
		}()
	}
	return e, nil
}

func (e *env) close() {
	if e.cur != nil {
		e.cur.Close()
	}
	if e.first != nil {
		_ = e.first.Close()
	}
	if e.ln != nil {
		_ = e.ln.Close()
		for nc := range e.accepted {
			_ = nc.Close()
		}
	}
}

// handshakeRequest is what the proxy sends (docs/protocol.md §4.1), with
// the given version.
func handshakeRequest(version int) *protocol.HandshakeRequest {
	return &protocol.HandshakeRequest{ProtocolVersion: version, ClientName: "sidecar-agent-check",
		SupportedFeatures: []string{protocol.FeatureCancellation, protocol.FeatureBodyMutation, protocol.FeatureStreaming, protocol.FeatureInlineBody}}
}

// dialRaw connects to a UDS agent without a handshake.
func (e *env) dialRaw() (net.Conn, error) {
	d := net.Dialer{Timeout: e.cfg.Timeout}
	nc, err := d.DialContext(e.ctx, "unix", e.cfg.Address)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConnect, err)
	}
	return nc, nil
}

// reach makes sure something answers at the agent's address before the
// checks run: a dial (uds, a gRPC target that names a socket path or a
// host:port), or for a reverse agent a first connection within
// ReconnectWait. Otherwise every check would fail on the same error.
func (e *env) reach() error {
	if e.cfg.Transport == TransportReverse {
		nc, at, err := e.acceptRaw(e.cfg.ReconnectWait)
		if err != nil {
			if errors.Is(err, ErrTimeout) {
				return &UnreachableError{Address: e.cfg.Address, Err: fmt.Errorf("no agent connected within %v (-reconnect-wait)", e.cfg.ReconnectWait)}
			}
			return err
		}
		e.first, e.firstAt = nc, at
		return nil
	}
	network, addr, ok := dialAddress(e.cfg.Transport, e.cfg.Address)
	if !ok {
		return nil // a gRPC target the checker does not resolve itself
	}
	d := net.Dialer{Timeout: e.cfg.Timeout}
	nc, err := d.DialContext(e.ctx, network, addr)
	if err != nil {
		// "no such file or directory", not "dial unix /x.sock: connect: …":
		// the address is said once.
		var oe *net.OpError
		if errors.As(err, &oe) {
			err = oe.Err
			var se *os.SyscallError
			if errors.As(err, &se) {
				err = se.Err
			}
		}
		if fi, serr := os.Stat(addr); network == "unix" && serr == nil && fi.Mode()&os.ModeSocket == 0 {
			err = fmt.Errorf("it exists and is not a socket (%v)", err)
		}
		return &UnreachableError{Address: e.cfg.Address, Err: err}
	}
	_ = nc.Close()
	return nil
}

// dialAddress is the network address of a uds agent's socket or of a
// gRPC target that is a socket path (unix:/p, unix:///p, /p) or
// host:port (possibly dns:///host:port).
func dialAddress(transport, addr string) (network, address string, ok bool) {
	if transport == TransportUDS {
		return "unix", strings.TrimPrefix(addr, "unix:"), true
	}
	switch {
	case strings.HasPrefix(addr, "unix://"):
		return "unix", strings.TrimPrefix(addr, "unix://"), true
	case strings.HasPrefix(addr, "unix:"):
		return "unix", strings.TrimPrefix(addr, "unix:"), true
	case strings.HasPrefix(addr, "/"):
		return "unix", addr, true
	case strings.HasPrefix(addr, "dns:///"):
		addr = strings.TrimPrefix(addr, "dns:///")
	}
	if _, _, err := net.SplitHostPort(addr); err != nil || strings.Contains(addr, "/") {
		return "", "", false
	}
	return "tcp", addr, true
}

// acceptRaw waits for the next connection of a reverse agent.
func (e *env) acceptRaw(d time.Duration) (net.Conn, time.Time, error) {
	if nc := e.first; nc != nil {
		e.first = nil
		return nc, e.firstAt, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case nc, ok := <-e.accepted:
		if !ok {
			return nil, time.Time{}, fmt.Errorf("%w: listener closed", ErrConnect)
		}
		return nc, time.Now(), nil
	case <-t.C:
		return nil, time.Time{}, fmt.Errorf("%w: no connection from the agent within %v", ErrTimeout, d)
	case <-e.ctx.Done():
		return nil, time.Time{}, e.ctx.Err()
	}
}

// open returns a connection ready for events. For a reverse agent it is
// the registered connection kept from an earlier check, or the next one.
func (e *env) open() (link, error) {
	switch e.cfg.Transport {
	case TransportGRPC:
		l, cr, err := openGRPC(e.ctx, e.cfg.Address, e.cfg.Timeout, e.strays)
		if cr != nil {
			e.agentName = cr.GetAgentName()
		}
		return l, err
	case TransportReverse:
		if e.cur != nil && e.cur.alive() {
			return e.cur, nil
		}
		l, err := e.register()
		if err != nil {
			return nil, err
		}
		e.cur = l
		return l, nil
	}
	nc, err := e.dialRaw()
	if err != nil {
		return nil, err
	}
	req := handshakeRequest(protocol.Version)
	if e.protobuf() {
		req.SupportedFeatures = append(req.SupportedFeatures, protocol.FeatureProtobufPayloads)
	}
	sent := []string{}
	b, _ := uds.AppendFrame(nil, req)
	sent = append(sent, evidence(protocol.TypeHandshakeRequest, b[uds.HeaderSize:]))
	_ = nc.SetWriteDeadline(time.Now().Add(e.cfg.Timeout))
	if _, err := nc.Write(b); err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: send handshake: %v", ErrConnect, err)
	}
	fr := uds.NewFrameReader(nc)
	t, p, err := readFirstFrame(nc, fr, e.cfg.Timeout)
	if err != nil {
		_ = nc.Close()
		e.noteSetup(sent, nil, fmt.Errorf("%w: handshake answer: %w", ErrConnect, err))
		return nil, e.setupErr
	}
	recv := []string{evidence(t, p)}
	if t != protocol.TypeHandshakeResponse {
		_ = nc.Close()
		e.noteSetup(sent, recv, fmt.Errorf("%w: the answer to the HandshakeRequest is a %s frame, not a HandshakeResponse (0x02)", ErrConnect, t))
		return nil, e.setupErr
	}
	var resp protocol.HandshakeResponse
	if err := protocol.DecodeHandshakeResponse(p, &resp); err != nil {
		_ = nc.Close()
		e.noteSetup(sent, recv, fmt.Errorf("%w: HandshakeResponse does not decode: %v", ErrConnect, err))
		return nil, e.setupErr
	}
	switch {
	case !resp.Accepted || resp.Error != "":
		_ = nc.Close()
		e.noteSetup(sent, recv, fmt.Errorf("%w: the agent refused a version-2 handshake: %q", ErrConnect, resp.Error))
		return nil, e.setupErr
	case resp.ProtocolVersion != protocol.Version:
		_ = nc.Close()
		e.noteSetup(sent, recv, fmt.Errorf("%w: the agent speaks protocol %d, the proxy 2", ErrConnect, resp.ProtocolVersion))
		return nil, e.setupErr
	}
	enc := uds.JSON
	switch {
	case e.protobuf() && !resp.Capabilities.SupportsProtobufPayloads:
		_ = nc.Close()
		e.noteSetup(sent, recv, fmt.Errorf("%w: -payload-encoding protobuf, but the agent did not declare supports_protobuf_payloads to a proxy that offered protobuf_payloads (§2.7)", ErrConnect))
		return nil, e.setupErr
	case e.protobuf():
		enc = uds.Protobuf
	}
	// Declaring supports_protobuf_payloads to a proxy that did not offer
	// the feature is harmless (the proxy masks it, §5) as long as the agent
	// stays on JSON; if it switched anyway, every check below fails on its
	// undecodable replies.
	e.agentName = resp.AgentName
	e.noteSetup(sent, recv, nil)
	return newFramedLink(nc, fr, resp.Capabilities, e.cfg.Timeout, enc, e.strays), nil
}

// protobuf reports whether the checks run on protobuf payloads.
func (e *env) protobuf() bool { return e.cfg.PayloadEncoding == protocol.EncodingProtobuf }

// noteSetup keeps the first setup's frames as the handshake evidence.
func (e *env) noteSetup(sent, recv []string, err error) {
	if e.setupSent == nil {
		e.setupSent, e.setupRecv, e.setupErr = sent, recv, err
	}
	if err != nil {
		e.setupErr = err
	}
}

// release ends a check's use of l. A reverse connection is kept for the
// next check unless the check left it unusable (dirty).
func (e *env) release(l link, dirty bool) {
	if l == nil {
		return
	}
	if fl, ok := l.(*framedLink); ok && fl == e.cur && !dirty && fl.alive() {
		return
	}
	if fl, ok := l.(*framedLink); ok && fl == e.cur {
		e.cur = nil
	}
	l.Close()
}

// registration is a RegistrationRequest read off a new reverse connection.
type registration struct {
	nc   net.Conn
	fr   *uds.FrameReader
	req  protocol.RegistrationRequest
	typ  protocol.MsgType
	ev   string
	at   time.Time
	prob string // why it is not acceptable ("" when it is)
}

// readRegistration waits for the agent's next connection and reads its
// first frame (docs/protocol.md §6.1, §6.2).
func (e *env) readRegistration(d time.Duration) (*registration, error) {
	nc, at, err := e.acceptRaw(d)
	if err != nil {
		return nil, err
	}
	fr := uds.NewFrameReader(nc)
	fr.SetMaxFrameSize(64 << 10)
	t, p, err := readFirstFrame(nc, fr, e.cfg.Timeout)
	if err != nil {
		_ = nc.Close()
		return nil, fmt.Errorf("%w: registration: %w", ErrConnect, err)
	}
	r := &registration{nc: nc, fr: fr, typ: t, ev: evidence(t, redactToken(p)), at: at}
	switch {
	case t != protocol.TypeRegistrationRequest && t != protocol.TypeHandshakeRequest:
		r.prob = fmt.Sprintf("the first frame is a %s, not a RegistrationRequest (0x03) (§6.1)", t)
	default:
		if err := protocol.DecodeRegistrationRequest(p, &r.req); err != nil {
			r.prob = fmt.Sprintf("the RegistrationRequest does not decode: %v (§6.2 check 1)", err)
			break
		}
		r.prob = e.judgeRegistration(&r.req)
	}
	return r, nil
}

func (e *env) judgeRegistration(req *protocol.RegistrationRequest) string {
	id := req.AgentID
	switch {
	case req.ProtocolVersion != protocol.Version:
		return fmt.Sprintf("protocol_version %d, not 2 (§6.2 check 2)", req.ProtocolVersion)
	case id == "":
		return "empty agent_id (§6.2 check 3)"
	case len(id) > 256:
		return "agent_id longer than 256 bytes (§6.2 check 4)"
	case !utf8.ValidString(id) || strings.IndexFunc(id, unicode.IsControl) >= 0:
		return "agent_id has control or invalid characters (§6.2 check 5)"
	case e.cfg.Token != "" && subtle.ConstantTimeCompare([]byte(req.AuthToken), []byte(e.cfg.Token)) != 1:
		return "auth_token does not match -token (§6.2 check 7, §6.4)"
	}
	return ""
}

// redactToken keeps the token out of the evidence.
func redactToken(p []byte) []byte {
	var req protocol.RegistrationRequest
	if protocol.DecodeRegistrationRequest(p, &req) != nil || req.AuthToken == "" {
		return p
	}
	return []byte(strings.ReplaceAll(string(p), req.AuthToken, "<token>"))
}

// answerRegistration writes the RegistrationResponse (in the frame type
// that matches the request's, §6.1), naming the payload encoding of the
// frames that follow an acceptance.
func answerRegistration(r *registration, accepted bool, errText string, enc uds.Encoding) error {
	resp := protocol.RegistrationResponse{Accepted: accepted, Error: errText}
	if accepted {
		resp.AssignedID = fmt.Sprintf("conn-%016x", nextID())
		if enc == uds.Protobuf {
			resp.PayloadEncoding = protocol.EncodingProtobuf
		}
	}
	b := protocol.AppendRegistrationResponse(nil, &resp)
	t := protocol.TypeRegistrationResponse
	if r.typ == protocol.TypeHandshakeRequest {
		t = protocol.TypeHandshakeResponse
	}
	f, err := uds.AppendRawFrame(nil, t, b)
	if err != nil {
		return err
	}
	_ = r.nc.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, err = r.nc.Write(f)
	return err
}

// register accepts the next registration, or refuses it and fails.
func (e *env) register() (*framedLink, error) {
	r, err := e.readRegistration(e.cfg.ReconnectWait)
	if err != nil {
		e.noteSetup(nil, nil, err)
		return nil, err
	}
	sent := []string{}
	if r.prob != "" {
		_ = answerRegistration(r, false, "invalid registration", uds.JSON)
		_ = r.nc.Close()
		e.noteSetup(sent, []string{r.ev}, fmt.Errorf("%w: %s", ErrConnect, r.prob))
		return nil, e.setupErr
	}
	enc := uds.JSON
	if e.protobuf() {
		if !r.req.Capabilities.SupportsProtobufPayloads || r.typ != protocol.TypeRegistrationRequest {
			_ = answerRegistration(r, false, "invalid registration", uds.JSON)
			_ = r.nc.Close()
			e.noteSetup(sent, []string{r.ev}, fmt.Errorf("%w: -payload-encoding protobuf, but the agent's RegistrationRequest (0x03) does not declare supports_protobuf_payloads (§2.7)", ErrConnect))
			return nil, e.setupErr
		}
		enc = uds.Protobuf
	}
	if err := answerRegistration(r, true, "", enc); err != nil {
		_ = r.nc.Close()
		return nil, fmt.Errorf("%w: answer registration: %v", ErrConnect, err)
	}
	e.agentName = r.req.AgentID
	answered := "0x04 RegistrationResponse {\"accepted\":true,…}"
	if enc == uds.Protobuf {
		answered = "0x04 RegistrationResponse {\"accepted\":true,\"payload_encoding\":\"protobuf\",…}"
	}
	e.noteSetup([]string{answered}, []string{r.ev}, nil)
	return newFramedLink(r.nc, r.fr, r.req.Capabilities, e.cfg.Timeout, enc, e.strays), nil
}

// ---------------------------------------------------------------------------
// The agent's process (Linux /proc).

// errNoProc: the process cannot be inspected.
var errNoProc = errors.New("agentcheck: process not inspectable")

// procAlive reports whether pid exists and is not a zombie.
func procAlive(pid int) bool {
	if err := syscall.Kill(pid, 0); err != nil && !errors.Is(err, syscall.EPERM) {
		return false
	}
	f, err := procStat(pid)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	// f[0] is the state.
	return len(f) == 0 || f[0] != "Z" && f[0] != "X"
}

// procStat returns the fields of /proc/<pid>/stat after the command name
// (which may hold spaces and parentheses): the state is f[0], field n of
// the whole line is f[n-3].
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("%w: unreadable stat", errNoProc)
	}
	return strings.Fields(s[i+1:]), nil
}

// clockTicks is USER_HZ, 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the user+system CPU time pid has used.
func procCPU(pid int) (time.Duration, error) {
	f, err := procStat(pid)
	if err != nil {
		if !errors.Is(err, errNoProc) {
			err = fmt.Errorf("%w: %v", errNoProc, err)
		}
		return 0, err
	}
	// utime and stime are fields 14 and 15 of the whole line.
	if len(f) < 13 {
		return 0, fmt.Errorf("%w: short stat", errNoProc)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%w: bad cpu fields", errNoProc)
	}
	return time.Duration(u+st) * time.Second / clockTicks, nil
}

// procRSS returns the resident set size of pid in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", errNoProc, err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) >= 1 {
				kb, err := strconv.ParseInt(f[0], 10, 64)
				if err != nil {
					return 0, fmt.Errorf("%w: bad VmRSS", errNoProc)
				}
				return kb << 10, nil
			}
		}
	}
	return 0, fmt.Errorf("%w: no VmRSS", errNoProc)
}

// cpuWindow is how long the checker watches for a spinning agent.
const cpuWindow = time.Second

// spinLimit is the share of one core an idle agent may want: an idle
// agent wants next to nothing; a spinning one wants a whole core, loaded
// machine or not (cpuShare counts its wait for a CPU).
const spinLimit = 0.2

// cpuShare measures the share of one core pid wants over cpuWindow: the
// time its threads ran or waited to run (/proc/<pid>/task/*/schedstat),
// so that a spinning agent on a loaded machine, which gets a fraction of
// a core but is always runnable, still counts as spinning; where
// schedstat is not kept, the CPU time it used.
func cpuShare(ctx context.Context, pid int) (float64, error) {
	r0, rerr := procRunnable(pid)
	c0, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	select {
	case <-time.After(cpuWindow):
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	wall := float64(time.Since(t0))
	if rerr == nil {
		if r1, err := procRunnable(pid); err == nil {
			var d time.Duration
			for tid, v := range r1 {
				d += v - r0[tid] // a thread started meanwhile: all of it
			}
			return float64(d) / wall, nil
		}
	}
	c1, err := procCPU(pid)
	if err != nil {
		return 0, err
	}
	return float64(c1-c0) / wall, nil
}

// procRunnable returns, per thread of pid, the time it has run plus the
// time it waited on a run queue (the first two fields of schedstat).
func procRunnable(pid int) (map[string]time.Duration, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	m := make(map[string]time.Duration, len(ents))
	for _, e := range ents {
		b, err := os.ReadFile(dir + "/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) < 2 {
			return nil, fmt.Errorf("%w: short schedstat", errNoProc)
		}
		run, err1 := strconv.ParseInt(f[0], 10, 64)
		wait, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: bad schedstat", errNoProc)
		}
		m[e.Name()] = time.Duration(run + wait)
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("%w: no schedstat", errNoProc)
	}
	return m, nil
}
