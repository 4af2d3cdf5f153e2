package http1

import "testing"

// TestPlainAlert: a plaintext alert is found among the records a read
// began with (a TLS 1.3 client's ChangeCipherSpec first, as OpenSSL sends
// it), and nothing else is taken for one.
func TestPlainAlert(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
		desc byte
		ok   bool
	}{
		{"alone", []byte{21, 3, 3, 0, 2, 2, 48}, 48, true},
		{"after ChangeCipherSpec", []byte{20, 3, 3, 0, 1, 1, 21, 3, 3, 0, 2, 2, 42}, 42, true},
		{"encrypted record", []byte{23, 3, 3, 0, 19, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19}, 0, false},
		{"alert cut short", []byte{21, 3, 3, 0, 2, 2}, 0, false},
		{"alert of another length", []byte{21, 3, 3, 0, 19, 2, 48}, 0, false},
		{"not TLS", []byte("GET / HTTP/1.1\r\n"), 0, false},
		{"record past the read", []byte{22, 3, 1, 2, 0, 1, 0}, 0, false},
		{"empty", nil, 0, false},
	} {
		desc, ok := plainAlert(tc.b)
		if desc != tc.desc || ok != tc.ok {
			t.Errorf("%s: %d %v, want %d %v", tc.name, desc, ok, tc.desc, tc.ok)
		}
	}
	if alertName(48) != "unknown_ca" || alertName(42) != "bad_certificate" || alertName(200) != "alert 200" {
		t.Errorf("names: %s %s %s", alertName(48), alertName(42), alertName(200))
	}
}
