package reverse

import (
	"crypto/tls"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/zentinelproxy/sidecar/internal/testutil"
	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
	"github.com/zentinelproxy/sidecar/uds"
)

// The tests of this file flood the pre-registration listener over real
// TCP sockets and measure how long an agent with the right token takes to
// register meanwhile, from the flood's own address (the hardest case: the
// listener cannot tell the agent from the attacker before its token).
// They judge by the listener's behaviour, not by the clock: the agent's
// first attempt must be accepted. The time is logged.

// floodTCPConfig is a TCP listener with the production limits and delays.
func floodTCPConfig(t *testing.T) Config {
	cfg := testConfig(t)
	d := DefaultConfig()
	cfg.UnixPath = ""
	cfg.TCPAddr = "127.0.0.1:0"
	cfg.RegistrationTimeout = d.RegistrationTimeout
	cfg.FailureDelay = d.FailureDelay
	cfg.MaxFailureDelay = d.MaxFailureDelay
	return cfg
}

// dialFrom dials addr over TCP from the loopback address ip (any of
// 127.0.0.0/8 works on Linux), so that one test plays many peers.
func dialFrom(ip, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return d.Dial("tcp", addr)
}

// flood runs f in n goroutines until the test's cleanup, which stops them
// and waits for them.
func flood(t *testing.T, n int, f func(i int, stop <-chan struct{})) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i, stop)
		}()
	}
	t.Cleanup(func() {
		close(stop)
		wg.Wait()
	})
}

// sleepOr waits d or until stop; false when stopped.
func sleepOr(d time.Duration, stop <-chan struct{}) bool {
	select {
	case <-time.After(d):
		return true
	case <-stop:
		return false
	}
}

// silentFlooder holds a connection from ip that never sends a byte, and
// opens a new one whenever the listener closes it (after a short pause,
// which bounds the test's churn of ports, not the attack).
func silentFlooder(addr, ip string) func(int, <-chan struct{}) {
	return func(_ int, stop <-chan struct{}) {
		for {
			nc, err := dialFrom(ip, addr)
			if err == nil {
				done := make(chan struct{})
				go func() {
					var b [1]byte
					_, _ = nc.Read(b[:]) // returns when the listener closes it
					close(done)
				}()
				select {
				case <-done:
				case <-stop:
				}
				_ = nc.Close()
				<-done
			}
			if !sleepOr(20*time.Millisecond, stop) {
				return
			}
		}
	}
}

// badTokenFlooder registers from 127.0.0.1 with a wrong token again and
// again, waiting for each refusal (held back by the failure slow-down).
func badTokenFlooder(addr string) func(int, <-chan struct{}) {
	return func(i int, stop <-chan struct{}) {
		for n := 0; ; n++ {
			nc, err := dialFrom("127.0.0.1", addr)
			if err == nil {
				_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
				if uds.WriteFrame(nc, regReq("waf-1", fmt.Sprintf("guess-%d-%d", i, n))) == nil {
					_, _, _ = uds.NewFrameReader(nc).Next()
				}
				_ = nc.Close()
			}
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}

// timeToRegister registers waf-9 from ip with the right token the way the
// SDK does by default: on a connection closed without an answer, again
// after 100ms, doubling (capped at 1s here to bound the test). It returns
// the time until the registration was accepted and the attempts it took;
// the connection is closed again.
func timeToRegister(t *testing.T, addr, ip string) (time.Duration, int) {
	return timeToRegisterWith(t, func() (net.Conn, error) { return dialFrom(ip, addr) })
}

// timeToRegisterWith is timeToRegister over the connections dial opens.
func timeToRegisterWith(t *testing.T, dial func() (net.Conn, error)) (time.Duration, int) {
	t.Helper()
	start := time.Now()
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if time.Since(start) > 15*time.Second {
			t.Fatalf("no registration within 15s (%d attempts)", attempt-1)
		}
		nc, err := dial()
		if err == nil {
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			var typ protocol.MsgType
			var payload []byte
			if err = uds.WriteFrame(nc, regReq("waf-9", testToken)); err == nil {
				typ, payload, err = uds.NewFrameReader(nc).Next()
			}
			_ = nc.Close()
			if err == nil {
				var r protocol.RegistrationResponse
				if typ != protocol.TypeRegistrationResponse || protocol.DecodeRegistrationResponse(payload, &r) != nil || !r.Accepted {
					t.Fatalf("attempt %d: answered 0x%02x %q", attempt, uint8(typ), payload)
				}
				return time.Since(start), attempt
			}
		}
		t.Logf("attempt %d after %v: %v", attempt, time.Since(start).Round(time.Millisecond), err)
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
	}
}

// TestRegisterDuringBadTokenFlood: 24 workers registering with wrong
// tokens from the agent's own address, each waiting for its held-back
// refusal and trying again at once, do not keep the agent out: a refusal
// being held back does not count toward the connections registering.
func TestRegisterDuringBadTokenFlood(t *testing.T) {
	cfg := floodTCPConfig(t)
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()
	flood(t, 24, badTokenFlooder(addr))
	// The flood is in force: every worker's failure has been held back.
	testutil.WaitFor(t, "24 refusals held back", func() bool { return l.Stats().Delayed >= 24 })

	took, attempts := timeToRegister(t, addr, "127.0.0.1")
	s := l.Stats()
	t.Logf("registered after %v in %d attempts during a flood of 24 bad-token workers (stats %+v)", took, attempts, s)
	if attempts != 1 {
		t.Errorf("the agent needed %d attempts, want its first to be accepted", attempts)
	}
	if s.Pending > int64(cfg.MaxPendingPerPeer) {
		t.Errorf("%d connections registering", s.Pending)
	}
}

// TestRegisterDuringSilentFloodOneAddress: connections from the agent's
// own address that never send a byte, as many as max_pending_per_peer and
// reopened as soon as they are closed, do not keep the agent out: the
// oldest silent one makes room for the newcomer.
func TestRegisterDuringSilentFloodOneAddress(t *testing.T) {
	cfg := floodTCPConfig(t)
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()
	flood(t, cfg.MaxPendingPerPeer, silentFlooder(addr, "127.0.0.1"))
	testutil.WaitFor(t, "the flood to fill the peer's registration slots", func() bool {
		return l.Stats().Pending == int64(cfg.MaxPendingPerPeer)
	})

	took, attempts := timeToRegister(t, addr, "127.0.0.1")
	s := l.Stats()
	t.Logf("registered after %v in %d attempts during %d silent connections from its address (stats %+v)", took, attempts, cfg.MaxPendingPerPeer, s)
	if attempts != 1 {
		t.Errorf("the agent needed %d attempts, want its first to be accepted", attempts)
	}
}

// TestRegisterOverTLSDuringSilentFlood: the same flood against a TLS
// listener. The agent's connection is receiving (its TLS handshake) for
// several round trips before its registration arrives; the flood's silent
// connections give way before it does.
func TestRegisterOverTLSDuringSilentFlood(t *testing.T) {
	p := newPKI(t)
	cfg := floodTCPConfig(t)
	cfg.TLS = &TLSConfig{CertFile: p.serverCert, KeyFile: p.serverKey}
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()
	client, err := sdk.LoadClientTLS(p.ca, "", "", "")
	if err != nil {
		t.Fatal(err)
	}
	flood(t, cfg.MaxPendingPerPeer, silentFlooder(addr, "127.0.0.1"))
	testutil.WaitFor(t, "the flood to fill the peer's registration slots", func() bool {
		return l.Stats().Pending == int64(cfg.MaxPendingPerPeer)
	})

	took, attempts := timeToRegisterWith(t, func() (net.Conn, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}, Config: client}
		return d.Dial("tcp", addr)
	})
	s := l.Stats()
	t.Logf("registered over TLS after %v in %d attempts during %d silent connections from its address (stats %+v)", took, attempts, cfg.MaxPendingPerPeer, s)
	if attempts != 1 {
		t.Errorf("the agent needed %d attempts, want its first to be accepted", attempts)
	}
	if s.TLSErrors != 0 {
		t.Errorf("%d TLS errors", s.TLSErrors)
	}
}

// TestRegisterDuringSilentFloodManyAddresses: 160 silent connections from
// ten addresses (16 each, over the 128 registering at once in all), one of
// them the agent's, reopened as soon as they are closed, do not keep the
// agent out either.
func TestRegisterDuringSilentFloodManyAddresses(t *testing.T) {
	cfg := floodTCPConfig(t)
	l := startListener(t, cfg)
	addr := l.TCPAddr().String()
	if nc, err := dialFrom("127.0.0.2", addr); err != nil {
		t.Skipf("cannot dial from 127.0.0.2: %v", err)
	} else {
		_ = nc.Close()
	}
	for i := 1; i <= 10; i++ {
		flood(t, cfg.MaxPendingPerPeer, silentFlooder(addr, fmt.Sprintf("127.0.0.%d", i)))
	}
	testutil.WaitFor(t, "the flood to fill the registration slots", func() bool {
		return l.Stats().Pending == int64(cfg.MaxPending)
	})

	took, attempts := timeToRegister(t, addr, "127.0.0.1")
	s := l.Stats()
	t.Logf("registered after %v in %d attempts during 160 silent connections from 10 addresses (stats %+v)", took, attempts, s)
	if attempts != 1 {
		t.Errorf("the agent needed %d attempts, want its first to be accepted", attempts)
	}
}
