package demoagent

import (
	"bytes"
	"context"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/zentinelproxy/sidecar/protocol"
	"github.com/zentinelproxy/sidecar/sdk"
)

func newDefault(t *testing.T) *Handler {
	t.Helper()
	h, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func TestRequestHeaders(t *testing.T) {
	h := newDefault(t)
	tests := []struct {
		uri      string
		ua       string
		kind     protocol.DecisionKind
		redirect string
		class    string
	}{
		{uri: "/", ua: "curl/8.5.0", kind: protocol.DecisionAllow, class: "cli"},
		{uri: "/api?x=1", ua: "Mozilla/5.0 (X11)", kind: protocol.DecisionAllow, class: "browser"},
		{uri: "/api", ua: "Googlebot/2.1", kind: protocol.DecisionAllow, class: "bot"},
		{uri: "/api", kind: protocol.DecisionAllow, class: "other"},
		{uri: "/administrator", kind: protocol.DecisionAllow, class: "other"},
		{uri: "/admin", kind: protocol.DecisionBlock},
		{uri: "/admin/", kind: protocol.DecisionBlock},
		{uri: "/admin/users?id=1", kind: protocol.DecisionBlock},
		{uri: "/ADMIN", kind: protocol.DecisionBlock},
		{uri: "//admin", kind: protocol.DecisionBlock},
		{uri: "/x/../admin", kind: protocol.DecisionBlock},
		{uri: "/%61dmin", kind: protocol.DecisionBlock},
		{uri: "http://example.com/admin", kind: protocol.DecisionBlock},
		{uri: "/old", kind: protocol.DecisionRedirect, redirect: "/new"},
		{uri: "/old/a/b?q=1", kind: protocol.DecisionRedirect, redirect: "/new/a/b?q=1"},
		{uri: "/old//evil.example", kind: protocol.DecisionRedirect, redirect: "/new/evil.example"},
		{uri: "/older", kind: protocol.DecisionAllow, class: "other"},
	}
	for _, tc := range tests {
		t.Run(tc.uri, func(t *testing.T) {
			m := &protocol.RequestHeaders{RequestID: 1, Method: []byte("GET"), URI: []byte(tc.uri)}
			if tc.ua != "" {
				m.Headers = m.Headers.Add([]byte("user-agent"), []byte(tc.ua))
			}
			var d protocol.Decision
			if err := h.OnRequestHeaders(context.Background(), m, &d); err != nil {
				t.Fatal(err)
			}
			if d.Kind != tc.kind {
				t.Fatalf("kind = %v, want %v", d.Kind, tc.kind)
			}
			switch tc.kind {
			case protocol.DecisionBlock:
				if d.Status != 403 || string(d.BlockHeaders.Get("x-blocked-by")) != "demoagent" ||
					!bytes.Contains(d.Body, []byte(`"forbidden"`)) {
					t.Fatalf("block = %d %q %q", d.Status, d.BlockHeaders, d.Body)
				}
			case protocol.DecisionRedirect:
				if d.Status != 302 || string(d.RedirectURL) != tc.redirect {
					t.Fatalf("redirect = %d %q, want %q", d.Status, d.RedirectURL, tc.redirect)
				}
			default:
				got := map[string]string{}
				for _, op := range d.RequestHeaderOps {
					got[string(op.Name)] = string(op.Value)
				}
				if got["x-demo"] != "1" || got["x-client-class"] != tc.class {
					t.Fatalf("header ops = %v, want class %q", got, tc.class)
				}
			}
		})
	}
}

// redactWhole is the reference: the word masked in the whole body at once.
func redactWhole(body, word string, mask byte) string {
	lb, lw := strings.ToLower(body), strings.ToLower(word)
	out := []byte(body)
	for i := 0; i+len(lw) <= len(lb); {
		if lb[i:i+len(lw)] == lw {
			for k := range len(lw) {
				out[i+k] = mask
			}
			i += len(lw)
			continue
		}
		i++
	}
	return string(out)
}

// stream runs body through the handler's response phase split at cuts and
// returns what the proxy would forward.
func stream(t *testing.T, h *Handler, id uint64, ct, body string, cuts []int) string {
	t.Helper()
	ctx := context.Background()
	rh := &protocol.ResponseHeaders{RequestID: id, StatusCode: 200, HasBody: true}
	rh.Headers = rh.Headers.Add([]byte("content-type"), []byte(ct))
	var d protocol.Decision
	if err := h.OnResponseHeaders(ctx, rh, &d); err != nil {
		t.Fatal(err)
	}
	if len(d.ResponseHeaderOps) != 1 || string(d.ResponseHeaderOps[0].Name) != "x-inspected-by" {
		t.Fatalf("response header ops = %+v", d.ResponseHeaderOps)
	}
	var out bytes.Buffer
	prev := 0
	cuts = append(cuts, len(body))
	for i, c := range cuts {
		chunk := &protocol.BodyChunk{RequestID: id, ChunkIndex: uint32(i), Data: []byte(body[prev:c]), IsLast: i == len(cuts)-1}
		var r sdk.BodyReply
		if err := h.OnResponseBody(ctx, chunk, &r); err != nil {
			t.Fatal(err)
		}
		switch {
		case !r.UseMutation:
			if !r.Decision.Final() {
				t.Fatalf("chunk %d: needs_more from a streaming agent", i)
			}
			// A final allow forwards this chunk and the rest unseen.
			out.WriteString(body[prev:])
			return out.String()
		case r.Mutation.Action == protocol.MutationPass:
			out.Write(chunk.Data)
		case r.Mutation.Action == protocol.MutationReplace:
			out.Write(r.Mutation.Data)
		}
		prev = c
	}
	return out.String()
}

func TestRedactSplitChunks(t *testing.T) {
	h := newDefault(t)
	tests := []struct {
		name string
		body string
		cuts []int
	}{
		{"one chunk", "a secret b", nil},
		{"split word", "a secret b", []int{5}},
		{"split every byte", "xSeCrEtx secret", []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}},
		{"prefix at end then no match", "a sec", []int{4}},
		{"false start", "secsecret", []int{3, 6}},
		{"adjacent", "secretsecret", []int{6}},
		{"empty chunks", "secret", []int{0, 0, 3, 3}},
		{"ends with prefix", "xx secre", []int{7}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := stream(t, h, uint64(i+1), "text/plain", tc.body, tc.cuts)
			if want := redactWhole(tc.body, "secret", '*'); got != want {
				t.Fatalf("got %q, want %q", got, want)
			}
		})
	}
	if n := h.Streams(); n != 0 {
		t.Fatalf("%d streams left after their last chunk", n)
	}
}

func TestRedactRandom(t *testing.T) {
	h := newDefault(t)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := "secrtSECRT x"
	for iter := range 2000 {
		b := make([]byte, rng.IntN(60))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		var cuts []int
		for c := 0; c < len(b); c += rng.IntN(8) {
			cuts = append(cuts, c)
		}
		got := stream(t, h, uint64(iter+100), "text/html; charset=utf-8", string(b), cuts)
		if want := redactWhole(string(b), "secret", '*'); got != want {
			t.Fatalf("body %q cuts %v: got %q, want %q", b, cuts, got, want)
		}
	}
}

func TestRedactSkipsBinaryAndCompressed(t *testing.T) {
	h := newDefault(t)
	if got := stream(t, h, 1, "application/octet-stream", "secret", []int{2}); got != "secret" {
		t.Fatalf("binary body changed: %q", got)
	}
	ctx := context.Background()
	rh := &protocol.ResponseHeaders{RequestID: 2, StatusCode: 200, HasBody: true}
	rh.Headers = rh.Headers.Add([]byte("content-type"), []byte("text/plain")).Add([]byte("content-encoding"), []byte("gzip"))
	var d protocol.Decision
	if err := h.OnResponseHeaders(ctx, rh, &d); err != nil {
		t.Fatal(err)
	}
	if h.Streams() != 0 {
		t.Fatal("a gzip body is being redacted")
	}
}

func TestConfigValidate(t *testing.T) {
	bad := []Config{
		{BlockPrefix: "admin"},
		{RedirectFrom: "/a"},
		{RedirectFrom: "/a", RedirectTo: "b"},
		{Redact: "x"},
		{Redact: "a*b", Mask: '*'},
	}
	for _, c := range bad {
		if _, err := New(c); err == nil {
			t.Errorf("New(%+v) accepted", c)
		}
	}
	if _, err := New(Config{}); err != nil {
		t.Errorf("zero config: %v", err)
	}
}
