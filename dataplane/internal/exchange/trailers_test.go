package exchange

import (
	"slices"
	"testing"
)

func TestTrailerAllowed(t *testing.T) {
	for name, want := range map[string]bool{
		"grpc-status": true, "Grpc-Message": true, "X-Checksum": true, "Server-Timing": true, "Digest": true,
		"x-a-name-longer-than-twenty-four-bytes": true, "x-b": true,
		":status": false, ":authority": false, "bad name": false, "x\x00y": false, "": false,
		"Content-Length": false, "transfer-encoding": false, "TRAILER": false, "TE": false, "Connection": false,
		"keep-alive": false, "Upgrade": false, "Proxy-Authorization": false, "proxy-anything": false,
		"Host": false, "Max-Forwards": false, "Forwarded": false, "Via": false, "X-Forwarded-For": false,
		"x-forwarded-host-and-a-long-suffix": false, "X-Real-IP": false,
		"Expect": false, "Range": false, "If-None-Match": false, "Cache-Control": false, "Pragma": false,
		"Authorization": false, "WWW-Authenticate": false, "Authentication-Info": false,
		"Cookie": false, "Set-Cookie": false, "Location": false, "Retry-After": false, "Vary": false,
		"Age": false, "Expires": false, "Date": false, "Content-Type": false, "content-encoding": false,
		"Content-Range": false, "Content-Location": false, "Content-Language": false,
		"X-Sidecar-Decision": false, "x-sidecar-": false,
	} {
		if got := TrailerAllowed([]byte(name)); got != want {
			t.Errorf("TrailerAllowed(%q) = %v, want %v", name, got, want)
		}
	}
}

func TestTrailerNames(t *testing.T) {
	var got []string
	for n := range TrailerNames([]byte(" X-Sum ,Content-Length,, grpc-status\t, Host,x-b")) {
		got = append(got, string(n))
	}
	if want := []string{"X-Sum", "grpc-status", "x-b"}; !slices.Equal(got, want) {
		t.Errorf("names %q, want %q", got, want)
	}
}
