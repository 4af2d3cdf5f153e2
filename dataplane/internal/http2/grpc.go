package http2

import (
	"net/http"
	"strconv"
)

// gRPC clients read a call's outcome from grpc-status, not from the
// HTTP status: an HTTP 403 reaches a gRPC client as an UNKNOWN status
// with a transport error. The sidecar's own answers to a gRPC request
// (an agent's block, a fail-closed failure, an upstream failure) are
// therefore sent as gRPC does: HTTP 200, "Trailers-Only" (grpc-status
// and grpc-message in the only HEADERS frame, which ends the stream),
// the status mapped from the HTTP status the answer would have had.

// isGRPC reports a gRPC request: its content-type is application/grpc,
// alone or with a suffix (+proto, +json, ;params).
func isGRPC(ct string) bool {
	const p = "application/grpc"
	if len(ct) < len(p) || !eqFoldASCII(ct[:len(p)], p) {
		return false
	}
	return len(ct) == len(p) || ct[len(p)] == '+' || ct[len(p)] == ';'
}

func eqFoldASCII(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// gRPC status codes (google.golang.org/grpc/codes).
const (
	grpcUnknown           = 2
	grpcInvalidArgument   = 3
	grpcDeadlineExceeded  = 4
	grpcPermissionDenied  = 7
	grpcResourceExhausted = 8
	grpcUnimplemented     = 12
	grpcInternal          = 13
	grpcUnavailable       = 14
	grpcUnauthenticated   = 16
)

// grpcCode maps the HTTP status of the sidecar's answer to a gRPC
// status. 400 is INVALID_ARGUMENT (gRPC's HTTP mapping says INTERNAL,
// which is about a broken transport; here a 400 is a policy's verdict
// on the request), 429 RESOURCE_EXHAUSTED (a rate limit) and 504
// DEADLINE_EXCEEDED, where gRPC's mapping says UNAVAILABLE for both.
func grpcCode(status int) int {
	switch status {
	case http.StatusBadRequest:
		return grpcInvalidArgument
	case http.StatusUnauthorized:
		return grpcUnauthenticated
	case http.StatusForbidden:
		return grpcPermissionDenied
	case http.StatusNotFound:
		return grpcUnimplemented
	case http.StatusTooManyRequests:
		return grpcResourceExhausted
	case http.StatusBadGateway, http.StatusServiceUnavailable:
		return grpcUnavailable
	case http.StatusGatewayTimeout:
		return grpcDeadlineExceeded
	case http.StatusInternalServerError:
		return grpcInternal
	}
	return grpcUnknown
}

// maxGRPCMessage bounds grpc-message (before encoding): the message is
// for people, and the client's header limit is not ours to find.
const maxGRPCMessage = 1 << 10

// appendGRPCMessage appends msg percent-encoded as the gRPC spec asks of
// grpc-message: bytes outside 0x20..0x7E, and '%', as %XX.
func appendGRPCMessage(dst, msg []byte) []byte {
	if len(msg) > maxGRPCMessage {
		msg = msg[:maxGRPCMessage]
	}
	const hex = "0123456789ABCDEF"
	for _, c := range msg {
		if c < 0x20 || c > 0x7e || c == '%' {
			dst = append(dst, '%', hex[c>>4], hex[c&15])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// writeGRPCAnswer writes the sidecar's answer of status with body to a
// gRPC request, Trailers-Only.
func (f *stream) writeGRPCAnswer(status int, body []byte) {
	h := f.w.Header()
	clear(h)
	h["Content-Type"] = []string{"application/grpc"}
	h["Grpc-Status"] = []string{strconv.Itoa(grpcCode(status))}
	if len(body) > 0 {
		f.scratch = appendGRPCMessage(f.scratch[:0], body)
		h["Grpc-Message"] = []string{string(f.scratch)}
	}
	f.w.WriteHeader(http.StatusOK)
	f.srv.stats.grpcAnswers.Add(1)
}
