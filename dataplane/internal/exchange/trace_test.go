package exchange

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseTraceparent(t *testing.T) {
	const good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{good, true},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00", true},
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", true},
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-future", true},
		{"01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01xfuture", false},
		{good + "-x", false}, // version 00 is exactly 55 characters
		{"ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", false},
		{"00-00000000000000000000000000000000-b7ad6b7169203331-01", false},
		{"00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01", false},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-0g", false},
		{"00_0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", false},
		{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b716920333-01", false},
		{"0-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-011", false},
		{"", false},
	} {
		tid, pid, flags, ok := parseTraceparent([]byte(tc.in))
		if ok != tc.ok {
			t.Errorf("%q: ok %v, want %v", tc.in, ok, tc.ok)
			continue
		}
		if ok && strings.HasPrefix(tc.in, "00-") {
			var buf [traceparentLen]byte
			formatTraceparent(&buf, &tid, &pid, flags)
			if string(buf[:]) != tc.in {
				t.Errorf("%q formats back as %q", tc.in, buf[:])
			}
		}
	}
}

func TestTracestate(t *testing.T) {
	for _, tc := range []struct {
		in string
		n  int
		ok bool
	}{
		{"congo=t61rcWkgMzE", 1, true},
		{"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE", 2, true},
		{" rojo=1 , , congo=2 ", 2, true},
		{"tenant@system=v", 1, true},
		{"1tenant@sys=v", 1, true},
		{"", 0, true},
		{"Rojo=1", 0, false},
		{"rojo", 0, false},
		{"rojo=", 0, false},
		{"rojo=a=b", 0, false},
		{"rojo=in side ", 1, true},
		{"t@Sys=v", 0, false},
		{"t@system-is-far-too-long=v", 0, false},
		{"rojo=\x7f", 0, false},
		{"k=" + strings.Repeat("v", 257), 0, false},
	} {
		n, ok := tracestateMembers([]byte(tc.in))
		if ok != tc.ok || (ok && n != tc.n) {
			t.Errorf("%q: %d, %v; want %d, %v", tc.in, n, ok, tc.n, tc.ok)
		}
	}
}

// FuzzTraceparent: the parser never panics, and what it accepts as
// version 00 formats back to the same bytes.
func FuzzTraceparent(f *testing.F) {
	f.Add([]byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
	f.Add([]byte("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-x"))
	f.Add([]byte("ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"))
	f.Add([]byte("00-00000000000000000000000000000000-0000000000000000-00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tid, pid, flags, ok := parseTraceparent(b)
		if !ok {
			return
		}
		if len(b) < traceparentLen || bytes.HasPrefix(b, []byte("ff")) {
			t.Fatalf("accepted %q", b)
		}
		if bytes.HasPrefix(b, []byte("00-")) {
			var buf [traceparentLen]byte
			formatTraceparent(&buf, &tid, &pid, flags)
			if !bytes.Equal(buf[:], b) {
				t.Fatalf("%q formats back as %q", b, buf[:])
			}
		}
	})
}

// FuzzTracestate: the checker never panics and counts at most one member
// per comma-separated element.
func FuzzTracestate(f *testing.F) {
	f.Add([]byte("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"))
	f.Add([]byte("a@b=c, ,d=e"))
	f.Add([]byte("=,,="))
	f.Fuzz(func(t *testing.T, b []byte) {
		n, _ := tracestateMembers(b)
		if n > bytes.Count(b, []byte(","))+1 {
			t.Fatalf("%q: %d members", b, n)
		}
	})
}

func TestFormatTraceparentNoAlloc(t *testing.T) {
	var buf [traceparentLen]byte
	var tid [16]byte
	var sid [8]byte
	randomID(tid[:])
	randomID(sid[:])
	if n := testing.AllocsPerRun(100, func() {
		randomID(sid[:])
		formatTraceparent(&buf, &tid, &sid, 1)
		_, _, _, _ = parseTraceparent(buf[:])
	}); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}
