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
// They judge by the listener's behaviour, not by the clock: six
// registrations in a row must each be accepted at their first attempt
// (see firstAttempts). The time is logged.

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

// registerOnce registers waf-9 with the right token over a connection
// dial opens, and closes it again: nil when accepted, the error when the
// connection was closed without an answer. A refusal fails the test.
func registerOnce(t *testing.T, dial func() (net.Conn, error)) error {
	t.Helper()
	nc, err := dial()
	if err != nil {
		return err
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
	if err := uds.WriteFrame(nc, regReq("waf-9", testToken)); err != nil {
		return err
	}
	typ, payload, err := uds.NewFrameReader(nc).Next()
	if err != nil {
		return err
	}
	var r protocol.RegistrationResponse
	if typ != protocol.TypeRegistrationResponse || protocol.DecodeRegistrationResponse(payload, &r) != nil || !r.Accepted {
		t.Fatalf("answered 0x%02x %q", uint8(typ), payload)
	}
	return nil
}

// firstAttempts is how the tests judge a flood: an agent with the right
// token registers from ip the way the SDK does by default (on a
// connection closed without an answer, again after 100ms, doubling; capped
// at 1s here to bound the test) and the time it takes is logged; then,
// 50ms apart, it registers again five times, each on its first attempt
// only. Every one of the six must be accepted at its first attempt: a
// flood that keeps the agent out most of the time cannot pass by luck.
func firstAttempts(t *testing.T, what string, dial func() (net.Conn, error)) {
	t.Helper()
	start := time.Now()
	backoff := 100 * time.Millisecond
	attempts := 1
	for {
		err := registerOnce(t, dial)
		if err == nil {
			break
		}
		t.Logf("attempt %d after %v: %v", attempts, time.Since(start).Round(time.Millisecond), err)
		if time.Since(start) > 15*time.Second {
			t.Fatalf("no registration within 15s during %s (%d attempts)", what, attempts)
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, time.Second)
		attempts++
	}
	t.Logf("registered after %v in %d attempts during %s", time.Since(start), attempts, what)
	failed := 0
	if attempts > 1 {
		failed++
	}
	for i := range 5 {
		time.Sleep(50 * time.Millisecond)
		if err := registerOnce(t, dial); err != nil {
			t.Logf("registration %d: %v", i+2, err)
			failed++
		}
	}
	if failed > 0 {
		t.Errorf("%d of 6 registrations during %s were not accepted at their first attempt", failed, what)
	}
}

// from dials addr from ip.
func from(ip, addr string) func() (net.Conn, error) {
	return func() (net.Conn, error) { return dialFrom(ip, addr) }
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

	firstAttempts(t, "a flood of 24 bad-token workers from its address", from("127.0.0.1", addr))
	t.Logf("stats %+v", l.Stats())
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

	firstAttempts(t, "16 silent connections from its address", from("127.0.0.1", addr))
	t.Logf("stats %+v", l.Stats())
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

	firstAttempts(t, "16 silent connections from its address (TLS)", func() (net.Conn, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}, Config: client}
		return d.Dial("tcp", addr)
	})
	s := l.Stats()
	t.Logf("stats %+v", s)
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

	firstAttempts(t, "160 silent connections from 10 addresses, its own among them", from("127.0.0.1", addr))
	t.Logf("stats %+v", l.Stats())
}
