// Package demoagent is the example agent that `sidecar demo` runs: it shows
// each kind of decision an agent can make, in a few lines each.
//
//   - Requests for a blocked path (default /admin and everything below it)
//     are answered 403 with a JSON body and an x-blocked-by header; the
//     upstream never sees them.
//   - Requests under a redirect prefix (default /old) are redirected (302) to
//     the same path under another prefix (default /new).
//   - Every allowed request gets two headers on its way upstream:
//     x-demo: 1 and x-client-class (cli, browser, bot or other,
//     from the User-Agent).
//   - Every response gets x-inspected-by: demoagent, and a word
//     (default "secret", any letter case) is masked with asterisks in text
//     response bodies while they stream through, also when the word is
//     split across body chunks.
//
// Copy it as the starting point of your own agent: New returns an
// sdk.Handler; cmd/demoagent serves it on a Unix socket.
package demoagent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

// ErrDemoAgentConfig is returned by Config.Validate for an unusable setting.
var ErrDemoAgentConfig = errors.New("demoagent: invalid config")

// Config tunes the demo agent. The zero value of a field disables that
// behavior; DefaultConfig enables all of them.
type Config struct {
	// BlockPrefix is the path whose requests are blocked, with everything
	// below it (compared after percent-decoding and cleaning, ignoring
	// letter case).
	BlockPrefix string
	// RedirectFrom and RedirectTo: a request under RedirectFrom is
	// redirected (302) to the same path under RedirectTo.
	RedirectFrom string
	RedirectTo   string
	// Redact is the word masked in text response bodies (ASCII letter case
	// ignored). Its length is kept, so body sizes do not change.
	Redact string
	// Mask replaces each byte of the redacted word.
	Mask byte
}

// DefaultConfig blocks /admin, redirects /old to /new and masks "secret".
func DefaultConfig() Config {
	return Config{
		BlockPrefix:  "/admin",
		RedirectFrom: "/old",
		RedirectTo:   "/new",
		Redact:       "secret",
		Mask:         '*',
	}
}

// Validate reports the first unusable setting.
func (c Config) Validate() error {
	for _, p := range []struct{ key, v string }{
		{"block_prefix", c.BlockPrefix}, {"redirect_from", c.RedirectFrom}, {"redirect_to", c.RedirectTo},
	} {
		if p.v != "" && !strings.HasPrefix(p.v, "/") {
			return fmt.Errorf("%w: %s %q must start with /", ErrDemoAgentConfig, p.key, p.v)
		}
	}
	if (c.RedirectFrom == "") != (c.RedirectTo == "") {
		return fmt.Errorf("%w: redirect_from and redirect_to go together", ErrDemoAgentConfig)
	}
	if c.Redact != "" {
		if c.Mask == 0 {
			return fmt.Errorf("%w: mask is required with redact", ErrDemoAgentConfig)
		}
		if strings.IndexByte(strings.ToLower(c.Redact), lower(c.Mask)) >= 0 {
			// A masked word could then match again.
			return fmt.Errorf("%w: mask %q appears in the redacted word", ErrDemoAgentConfig, c.Mask)
		}
	}
	return nil
}

// Handler is the demo agent. Create it with New.
type Handler struct {
	cfg          Config
	blockPath    string // lower-case, cleaned
	redirectFrom string // lower-case, cleaned
	redactWord   []byte // lower-case

	mu        sync.Mutex
	streams   map[uint64]*redactor // response bodies being redacted
	lastSweep time.Time
}

// New returns the demo agent for cfg.
func New(cfg Config) (*Handler, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Handler{
		cfg:          cfg,
		blockPath:    strings.ToLower(path.Clean(cfg.BlockPrefix)),
		redirectFrom: strings.ToLower(path.Clean(cfg.RedirectFrom)),
		streams:      make(map[uint64]*redactor),
	}
	if cfg.Redact != "" {
		h.redactWord = []byte(strings.ToLower(cfg.Redact))
	}
	return h, nil
}

var _ sdk.Handler = (*Handler)(nil)

// Capabilities implements sdk.Handler: request and response headers, and
// response bodies chunk by chunk when redaction is on.
func (h *Handler) Capabilities() protocol.Capabilities {
	return protocol.Capabilities{
		HandlesRequestHeaders:  true,
		HandlesResponseHeaders: true,
		HandlesResponseBody:    h.redactWord != nil,
		SupportsStreaming:      true,
		SupportsCancellation:   true,
	}
}

// Header names and values are package-level so decisions reference them
// without allocating; the SDK encodes them before the next event.
var (
	hdrDemo        = []byte("x-demo")
	hdrClientClass = []byte("x-client-class")
	hdrInspected   = []byte("x-inspected-by")
	hdrBlockedBy   = []byte("x-blocked-by")
	hdrContentType = []byte("content-type")
	valOne         = []byte("1")
	valAgent       = []byte("demoagent")
	valJSON        = []byte("application/json")
	blockBody      = []byte(`{"error":"forbidden","reason":"this path is blocked by the demo agent"}` + "\n")

	classCLI     = []byte("cli")
	classBrowser = []byte("browser")
	classBot     = []byte("bot")
	classOther   = []byte("other")
)

// OnRequestHeaders implements sdk.Handler: block, redirect or allow with
// extra headers.
func (h *Handler) OnRequestHeaders(_ context.Context, m *protocol.RequestHeaders, d *protocol.Decision) error {
	p, query := splitURI(m.URI)
	if h.cfg.BlockPrefix != "" && underPrefix(p, h.blockPath) {
		d.Kind = protocol.DecisionBlock
		d.Status = 403
		d.Body = blockBody
		d.BlockHeaders = d.BlockHeaders.Add(hdrContentType, valJSON).Add(hdrBlockedBy, valAgent)
		d.Audit.Tags = append(d.Audit.Tags, []byte("demo"), []byte("blocked-path"))
		return nil
	}
	if h.cfg.RedirectFrom != "" && underPrefix(p, h.redirectFrom) {
		// The decoded, cleaned path keeps the redirect target free of "..".
		target := path.Clean(h.cfg.RedirectTo + p[len(h.redirectFrom):])
		d.Kind = protocol.DecisionRedirect
		d.Status = 302
		d.RedirectURL = []byte((&url.URL{Path: target}).EscapedPath() + queryPart(query))
		return nil
	}
	d.RequestHeaderOps = append(d.RequestHeaderOps,
		protocol.HeaderOp{Op: protocol.HeaderSet, Name: hdrDemo, Value: valOne},
		protocol.HeaderOp{Op: protocol.HeaderSet, Name: hdrClientClass, Value: classify(m.Headers.Get("user-agent"))},
	)
	return nil
}

// OnResponseHeaders implements sdk.Handler: mark the response and decide
// whether its body is redacted.
func (h *Handler) OnResponseHeaders(_ context.Context, m *protocol.ResponseHeaders, d *protocol.Decision) error {
	d.ResponseHeaderOps = append(d.ResponseHeaderOps,
		protocol.HeaderOp{Op: protocol.HeaderSet, Name: hdrInspected, Value: valAgent})
	if h.redactWord != nil && m.HasBody && redactable(m.Headers) {
		h.startStream(m.RequestID)
	}
	return nil
}

// OnRequestBody implements sdk.Handler; the demo agent does not ask for
// request bodies, so this only runs against a misbehaving proxy.
func (h *Handler) OnRequestBody(_ context.Context, _ *protocol.BodyChunk, r *sdk.BodyReply) error {
	r.Pass()
	return nil
}

// OnResponseBody implements sdk.Handler: mask the word in this chunk.
func (h *Handler) OnResponseBody(_ context.Context, m *protocol.BodyChunk, r *sdk.BodyReply) error {
	h.mu.Lock()
	st := h.streams[m.RequestID]
	if st != nil {
		st.seen = time.Now()
	}
	h.mu.Unlock()
	if st == nil {
		// Not a text body: a final allow forwards this chunk as it is and
		// tells the proxy to stop sending the rest.
		return nil
	}
	out, changed := st.write(m.Data, m.IsLast)
	switch {
	case !changed:
		r.Pass()
	case len(out) == 0:
		r.Drop() // everything is held back until the next chunk
	default:
		r.Replace(out)
	}
	if m.IsLast {
		h.endStream(m.RequestID)
	}
	return nil
}

// streamTTL bounds how long the state of an unfinished response body (a
// client that went away mid-body) is kept.
const streamTTL = 2 * time.Minute

func (h *Handler) startStream(id uint64) {
	st := redactorPool.Get().(*redactor)
	st.reset(h.redactWord, h.cfg.Mask)
	now := time.Now()
	st.seen = now
	h.mu.Lock()
	if old := h.streams[id]; old != nil {
		redactorPool.Put(old)
	}
	h.streams[id] = st
	if now.Sub(h.lastSweep) > streamTTL/4 {
		h.lastSweep = now
		for k, v := range h.streams {
			if now.Sub(v.seen) > streamTTL {
				delete(h.streams, k)
			}
		}
	}
	h.mu.Unlock()
}

func (h *Handler) endStream(id uint64) {
	h.mu.Lock()
	st := h.streams[id]
	delete(h.streams, id)
	h.mu.Unlock()
	if st != nil {
		redactorPool.Put(st)
	}
}

// Streams reports how many response bodies are being redacted right now.
func (h *Handler) Streams() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.streams)
}

// splitURI returns the percent-decoded, cleaned path and the raw query.
func splitURI(uri []byte) (p, query string) {
	s := string(uri)
	if i := strings.IndexByte(s, '?'); i >= 0 {
		s, query = s[:i], s[i+1:]
	}
	if i := strings.IndexByte(s, '#'); i >= 0 {
		s = s[:i]
	}
	if d, err := url.PathUnescape(s); err == nil {
		s = d
	}
	if !strings.HasPrefix(s, "/") {
		// Absolute-form URI (http://host/path) or garbage: keep the path part.
		if u, err := url.Parse(s); err == nil && u.Path != "" {
			s = u.Path
		} else {
			s = "/" + s
		}
	}
	return path.Clean(s), query
}

func queryPart(q string) string {
	if q == "" {
		return ""
	}
	return "?" + q
}

// underPrefix reports whether p is prefix or below it, ignoring case.
func underPrefix(p, prefix string) bool {
	if prefix == "/" {
		return true
	}
	if len(p) < len(prefix) || !strings.EqualFold(p[:len(prefix)], prefix) {
		return false
	}
	return len(p) == len(prefix) || p[len(prefix)] == '/'
}

// classify sorts a User-Agent into a coarse class.
func classify(ua []byte) []byte {
	var buf [256]byte
	l := buf[:0]
	for _, c := range ua[:min(len(ua), len(buf))] {
		l = append(l, lower(c))
	}
	switch {
	case len(l) == 0:
		return classOther
	case bytes.Contains(l, []byte("bot")) || bytes.Contains(l, []byte("spider")) || bytes.Contains(l, []byte("crawl")):
		return classBot
	case bytes.HasPrefix(l, []byte("curl/")) || bytes.HasPrefix(l, []byte("wget/")) ||
		bytes.HasPrefix(l, []byte("httpie/")) || bytes.HasPrefix(l, []byte("go-http-client/")):
		return classCLI
	case bytes.HasPrefix(l, []byte("mozilla/")):
		return classBrowser
	}
	return classOther
}

// redactable reports whether a response body is text we can rewrite:
// compressed bodies are passed through untouched.
func redactable(h protocol.Headers) bool {
	if ce := h.Get("content-encoding"); len(ce) > 0 && !bytes.EqualFold(ce, []byte("identity")) {
		return false
	}
	ct := bytes.ToLower(h.Get("content-type"))
	if len(ct) == 0 {
		return false
	}
	return bytes.HasPrefix(ct, []byte("text/")) || bytes.Contains(ct, []byte("json")) ||
		bytes.Contains(ct, []byte("xml")) || bytes.Contains(ct, []byte("javascript"))
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}
