package config_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// TestHTTP2Keys: the protocols of listeners and upstreams, their
// defaults, and the errors that name the key and its line.
func TestHTTP2Keys(t *testing.T) {
	const tmpl = `
listeners:
  - address: 127.0.0.1:8080
    LISTENER
upstreams:
  - name: app
    address: 127.0.0.1:9000
    UPSTREAM
routes: [{upstream: app}]
`
	parse := func(l, u string) (*config.Config, error) {
		return config.Parse([]byte(strings.NewReplacer("LISTENER", l, "UPSTREAM", u).Replace(tmpl)))
	}
	c, err := parse("", "")
	if err != nil {
		t.Fatal(err)
	}
	l, u := c.Listeners[0], c.Upstreams[0]
	if !slices.Equal(l.Protocols, []string{"http1"}) || l.HTTP2.MaxConcurrentStreams != 100 ||
		l.HTTP2.MaxHeaderListSize != l.ReadBufferSize || l.HTTP2.MaxReadFrameSize != 16<<10 || u.Protocol != "http1" {
		t.Errorf("defaults: protocols %v, http2 %+v, upstream protocol %q", l.Protocols, l.HTTP2, u.Protocol)
	}
	if c, err = parse("read_buffer_size: 32KiB", "protocol: h2c"); err != nil || c.Listeners[0].HTTP2.MaxHeaderListSize != 32<<10 || c.Upstreams[0].Protocol != "h2c" {
		t.Errorf("max_header_list_size follows read_buffer_size: %v %+v", err, c)
	}
	for _, tc := range []struct{ l, u, want string }{
		{"protocols: [h2]", "", `line 4: listeners[0].protocols[0]: h2 needs tls`},
		{"protocols: [http1, http1]", "", `line 4: listeners[0].protocols[1]: "http1" is listed twice`},
		{"protocols: [http3]", "", `line 4: listeners[0].protocols[0]: unknown protocol "http3"`},
		{"protocols: []", "", `line 4: listeners[0].protocols: at least one protocol is required`},
		{"http2: {max_concurrent_streams: -1}", "", `line 4: listeners[0].http2.max_concurrent_streams`},
		{"http2: {max_read_frame_size: 1KiB}", "", `line 4: listeners[0].http2.max_read_frame_size: 1KiB is not in 16KiB..16MiB-1`},
		{"http2: {max_header_list_size: 2MiB}", "", `line 4: listeners[0].http2.max_header_list_size`},
		{"", "protocol: h2", `line 8: upstreams[0].protocol: h2 needs tls`},
		{"", "protocol: spdy", `line 8: upstreams[0].protocol: unknown protocol "spdy"`},
	} {
		_, err := parse(tc.l, tc.u)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q %q: %v, want %q", tc.l, tc.u, err, tc.want)
		}
	}
}
