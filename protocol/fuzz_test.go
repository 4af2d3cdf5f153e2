package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// Each target checks, for any input: no panic; the input is not modified;
// a failure wraps one of the sentinels; decoding into a message that held
// another payload gives the same result as decoding into a fresh one; a
// decoded Decision survives Normalize without panicking, and Normalize
// either fails with a sentinel or is idempotent; what is read (decoded,
// normalized) re-encodes to valid JSON that reads back as the same message
// (up to the documented normalisations: header grouping, last-wins block
// headers) and re-encodes byte for byte (the canonical form is a fixed
// point).

// addGoldenSeeds adds the golden payloads whose names start with one of
// prefixes; Go adds testdata/fuzz/<FuzzName>/ itself.
func addGoldenSeeds(f *testing.F, prefixes ...string) {
	for _, g := range readGoldens(f) {
		for _, p := range prefixes {
			if strings.HasPrefix(g.name, p) {
				f.Add(g.payload)
				break
			}
		}
	}
}

func groupHeaders(h Headers) Headers {
	out := Headers{}
	done := map[string]bool{}
	for i := range h {
		name := string(h[i].Name)
		if done[name] {
			continue
		}
		done[name] = true
		for j := i; j < len(h); j++ {
			if string(h[j].Name) == name {
				out = append(out, h[j])
			}
		}
	}
	return out
}

func lastWins(h Headers) Headers {
	out := Headers{}
	at := map[string]int{}
	for _, f := range h {
		if i, ok := at[string(f.Name)]; ok {
			out[i].Value = f.Value
			continue
		}
		at[string(f.Name)] = len(out)
		out = append(out, f)
	}
	return out
}

// readBack returns what m should read back as after an encode.
func readBack(m any) any {
	switch m := m.(type) {
	case *RequestHeaders:
		c := *m
		c.Headers = groupHeaders(m.Headers)
		return &c
	case *ResponseHeaders:
		c := *m
		c.Headers = groupHeaders(m.Headers)
		return &c
	case *Decision:
		c := *m
		c.BlockHeaders = lastWins(m.BlockHeaders)
		return &c
	}
	return m
}

// dirty holds, per codec, a message that has decoded a rich payload, so that
// state left over from it would show.
var dirty = map[string]any{}

func dirtyMessage(t *testing.T, c codec) any {
	m, ok := dirty[c.prefix]
	if !ok {
		m = c.fresh()
		dirty[c.prefix] = m
	}
	for _, g := range readGoldens(t) {
		if codecFor(t, g.name).prefix == c.prefix {
			if err := c.into(m, g.payload); err != nil {
				t.Fatal(err)
			}
		}
	}
	return m
}

func checkIdempotent(t *testing.T, c codec, payload []byte) {
	orig := bytes.Clone(payload)
	m1, err := c.decode(payload)
	if !bytes.Equal(payload, orig) {
		t.Fatalf("%s: decode modified its input", c.prefix)
	}
	m0 := dirtyMessage(t, c)
	err0 := c.into(m0, payload)
	if (err == nil) != (err0 == nil) {
		t.Fatalf("%s: fresh decode error %v, reused decode error %v", c.prefix, err, err0)
	}
	if err != nil {
		checkSentinel(t, c, err)
		return
	}
	if show(m0) != show(m1) {
		t.Fatalf("%s: reused message decodes differently\nfresh:  %s\nreused: %s", c.prefix, show(m1), show(m0))
	}
	if d, ok := m1.(*Decision); ok {
		if err := d.Normalize(); err != nil {
			checkSentinel(t, c, err)
			return
		}
		once := show(d)
		if err := d.Normalize(); err != nil || show(d) != once {
			t.Fatalf("%s: Normalize is not idempotent (%v)\nonce:  %s\ntwice: %s", c.prefix, err, once, show(d))
		}
	}
	e1 := c.encode(nil, m1)
	if !json.Valid(e1) {
		t.Fatalf("%s: encoded invalid JSON %q", c.prefix, e1)
	}
	m2, err := c.read(e1)
	if err != nil {
		t.Fatalf("%s: re-encoded %q does not read back: %v", c.prefix, e1, err)
	}
	if want := readBack(m1); show(m2) != show(want) {
		t.Fatalf("%s: round trip changed the message\n got: %s\nwant: %s\nvia %q", c.prefix, show(m2), show(want), e1)
	}
	if e2 := c.encode(nil, m2); !bytes.Equal(e1, e2) {
		t.Fatalf("%s: canonical form is not a fixed point\n%q\n%q", c.prefix, e1, e2)
	}
}

func checkSentinel(t *testing.T, c codec, err error) {
	t.Helper()
	if !errors.Is(err, ErrProtocolSyntax) && !errors.Is(err, ErrProtocolField) && !errors.Is(err, ErrProtocolDecision) {
		t.Fatalf("%s: error %v wraps no sentinel", c.prefix, err)
	}
}

func fuzzCodecs(f *testing.F, prefixes ...string) {
	addGoldenSeeds(f, prefixes...)
	f.Fuzz(func(t *testing.T, payload []byte) {
		for _, p := range prefixes {
			checkIdempotent(t, codecFor(t, p), payload)
		}
	})
}

func FuzzDecodeRequestHeaders(f *testing.F) { fuzzCodecs(f, "request_headers") }

func FuzzDecodeBodyChunk(f *testing.F) {
	fuzzCodecs(f, "request_body_chunk", "response_body_chunk")
}

func FuzzDecodeResponseHeaders(f *testing.F) { fuzzCodecs(f, "response_headers") }

func FuzzDecodeDecision(f *testing.F) { fuzzCodecs(f, "decision") }

func FuzzDecodeBodyMutation(f *testing.F) { fuzzCodecs(f, "body_mutation") }

func FuzzDecodeHandshake(f *testing.F) {
	fuzzCodecs(f, "handshake_request", "handshake_response", "registration_request", "registration_response")
}

// FuzzPeekRequestID checks PeekRequestID against a full decode: whenever a
// hot message decodes, Peek finds the same request_id (when it is there).
func FuzzPeekRequestID(f *testing.F) {
	addGoldenSeeds(f, "")
	f.Fuzz(func(t *testing.T, payload []byte) {
		orig := bytes.Clone(payload)
		id, ok := PeekRequestID(payload)
		if !bytes.Equal(orig, payload) {
			t.Fatal("PeekRequestID modified its input")
		}
		var ref struct {
			RequestID *uint64 `json:"request_id"`
		}
		var m CancelRequest
		if m.Decode(payload) != nil || json.Unmarshal(payload, &ref) != nil {
			return
		}
		// Compare only where the rules agree: encoding/json keeps the last
		// duplicate key and matches keys case-insensitively, Peek takes the
		// first exact match.
		if bytes.Count(bytes.ToLower(payload), []byte("request")) != 1 || bytes.Count(payload, []byte("request_id")) != 1 ||
			bytes.Contains(payload, []byte(`\u`)) {
			return
		}
		if ok != (ref.RequestID != nil) || (ok && id != *ref.RequestID) || (ok && id != m.RequestID) {
			t.Fatalf("PeekRequestID = %d, %v; decode says %d", id, ok, m.RequestID)
		}
	})
}
