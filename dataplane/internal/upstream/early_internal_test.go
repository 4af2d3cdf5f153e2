package upstream

import "testing"

func TestCompleteAnswer(t *testing.T) {
	for _, tc := range []struct {
		in   string
		head bool
		want bool
	}{
		{"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\nConnection: close\r\n\r\nbig", false, true},
		{"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n\r\nbi", false, false},                       // body not all there
		{"HTTP/1.1 413 Payload Too Large\r\nContent-Length: 3\r\n", false, false},                             // head not all there
		{"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false, true}, // no body
		{"HTTP/1.1 302 Found\r\nLocation: /x\r\nContent-Length: 0\r\n\r\n", false, false},                     // kept: may still read
		{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false, false},                                      // kept: may still read
		{"HTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\nno", false, true},                             // an error, kept
		{"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n", false, true},                                 // no body by status
		{"HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n", true, true},                    // HEAD
		{"HTTP/1.1 100 Continue\r\n\r\n", false, false},                                                       // interim only
		{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 401 Unauthorized\r\nContent-Length: 2\r\n\r\nno", false, true},
		{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false, false}, // chunked: not judged
		{"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil close", false, false},        // ends with the connection
		{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", false, false},
		{"garbage\r\n\r\n", false, false},
	} {
		if got := completeAnswer([]byte(tc.in), tc.head); got != tc.want {
			t.Errorf("completeAnswer(%q, head=%v) = %v, want %v", tc.in, tc.head, got, tc.want)
		}
	}
}
