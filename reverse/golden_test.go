package reverse

import (
	"bytes"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
)

func readHex(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out, err := hex.DecodeString(strings.Join(strings.Fields(string(b)), ""))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return out
}

// TestGoldenRefusals replays testdata/reverse/*.in.hex byte for byte and
// compares everything the proxy sends before it closes with *.out.hex.
func TestGoldenRefusals(t *testing.T) {
	ins, err := filepath.Glob("../testdata/reverse/*.in.hex")
	if err != nil || len(ins) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	cfg := testConfig(t)
	startListener(t, cfg)
	n := 0
	for _, in := range ins {
		out := strings.TrimSuffix(in, ".in.hex") + ".out.hex"
		if _, err := os.Stat(out); err != nil {
			continue
		}
		n++
		t.Run(filepath.Base(in), func(t *testing.T) {
			c := dialRaw(t, "unix", cfg.UnixPath)
			c.sendRaw(readHex(t, in))
			got, err := io.ReadAll(c.nc)
			if err != nil && !isReset(err) {
				t.Fatal(err)
			}
			if want := readHex(t, out); !bytes.Equal(got, want) {
				t.Errorf("answer\n got %q\nwant %q", got, want)
			}
		})
	}
	if n < 5 {
		t.Errorf("only %d golden conversations", n)
	}
}

// TestGoldenAccepted: an accepted registration is followed by the normal
// protocol; a Ping from the agent (testdata/uds/ping.hex) is answered with
// a Pong echoing it.
func TestGoldenAccepted(t *testing.T) {
	cfg := testConfig(t)
	startListener(t, cfg)
	c := dialRaw(t, "unix", cfg.UnixPath)
	c.sendRaw(readHex(t, "../testdata/reverse/accepted.in.hex"))
	typ, resp := c.answer()
	if typ != protocol.TypeRegistrationResponse || !resp.Accepted || !strings.HasPrefix(resp.AssignedID, "conn-") {
		t.Fatalf("answer %s %+v", typ, resp)
	}
	ping := readHex(t, "../testdata/uds/ping.hex")
	c.sendRaw(ping)
	typ, payload, err := c.fr.Next()
	if err != nil {
		t.Fatal(err)
	}
	if typ != protocol.TypePong || !bytes.Equal(payload, ping[5:]) {
		t.Errorf("got %s %q, want Pong %q", typ, payload, ping[5:])
	}
}
