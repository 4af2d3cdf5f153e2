package http2

import "testing"

func TestGRPCStatusMapping(t *testing.T) {
	for status, want := range map[int]int{400: 3, 401: 16, 403: 7, 404: 12, 429: 8, 500: 13, 502: 14, 503: 14, 504: 4, 418: 2, 302: 2} {
		if got := grpcCode(status); got != want {
			t.Errorf("HTTP %d: gRPC %d, want %d", status, got, want)
		}
	}
}

func TestGRPCMessageEncoding(t *testing.T) {
	for in, want := range map[string]string{
		"denied":             "denied",
		"100% sure\n":        "100%25 sure%0A",
		"caf\u00e9":          "caf%C3%A9",
		"a\r\nX-Injected: 1": "a%0D%0AX-Injected: 1",
	} {
		if got := string(appendGRPCMessage(nil, []byte(in))); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
	long := make([]byte, 5000)
	for i := range long {
		long[i] = 'x'
	}
	if got := appendGRPCMessage(nil, long); len(got) != maxGRPCMessage {
		t.Errorf("a %d-byte message encodes to %d bytes, want %d", len(long), len(got), maxGRPCMessage)
	}
}

func TestIsGRPC(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/grpc": true, "application/grpc+proto": true, "Application/GRPC;charset=x": true,
		"application/grpc-web": false, "application/grpcx": false, "text/plain": false, "": false,
	} {
		if isGRPC(ct) != want {
			t.Errorf("%q: %v", ct, !want)
		}
	}
}
