package reverse

import (
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// maxTokenFileSize bounds a token file: a token is a line, not a document.
const maxTokenFileSize = 64 << 10

// tokenSet holds the SHA-256 of every accepted token. Hashing first makes
// every comparison one of equal length, so ConstantTimeCompare reveals
// nothing about a token's length or prefix.
type tokenSet struct {
	hashes    [][sha256.Size]byte
	allowNone bool
}

// loadTokens reads an agent's tokens from the config, its environment
// variable and its file. Errors name the source, never the value.
func loadTokens(a *AgentConfig) (tokenSet, error) {
	ts := tokenSet{allowNone: a.AllowNoToken}
	for _, t := range a.Tokens {
		ts.hashes = append(ts.hashes, sha256.Sum256([]byte(t)))
	}
	if a.TokenEnv != "" {
		v, ok := os.LookupEnv(a.TokenEnv)
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			return ts, fmt.Errorf("%w: agent %q: environment variable %s is unset or empty", ErrReverseConfig, a.Name, a.TokenEnv)
		}
		ts.hashes = append(ts.hashes, sha256.Sum256([]byte(v)))
	}
	if a.TokenFile != "" {
		f, err := os.Open(a.TokenFile)
		if err != nil {
			return ts, fmt.Errorf("%w: agent %q: token file: %v", ErrReverseConfig, a.Name, err)
		}
		b, err := io.ReadAll(io.LimitReader(f, maxTokenFileSize+1))
		_ = f.Close()
		if err != nil {
			return ts, fmt.Errorf("%w: agent %q: token file %s: %v", ErrReverseConfig, a.Name, a.TokenFile, err)
		}
		if len(b) > maxTokenFileSize {
			return ts, fmt.Errorf("%w: agent %q: token file %s larger than %d bytes", ErrReverseConfig, a.Name, a.TokenFile, maxTokenFileSize)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return ts, fmt.Errorf("%w: agent %q: token file %s is empty", ErrReverseConfig, a.Name, a.TokenFile)
		}
		ts.hashes = append(ts.hashes, sha256.Sum256([]byte(v)))
	}
	return ts, nil
}

// check reports whether token is accepted. Every configured token is
// compared, so the time taken does not tell which one (if any) matched.
func (ts *tokenSet) check(token string) bool {
	if token == "" || len(ts.hashes) == 0 {
		return ts.allowNone && (token == "" || len(ts.hashes) == 0)
	}
	h := sha256.Sum256([]byte(token))
	ok := 0
	for i := range ts.hashes {
		ok |= subtle.ConstantTimeCompare(h[:], ts.hashes[i][:])
	}
	return ok == 1
}

// overflowPeer is the shared entry of peers that found the table full.
const overflowPeer = "\x00overflow"

// failures remembers authentication failures per peer and turns them into
// an exponential delay before the peer's next registration is answered.
// The delay applies to every answer, not only to refusals: a peer that
// could tell an acceptance by its speed would simply stop waiting.
type failures struct {
	base, max, memory time.Duration
	limit             int

	mu    sync.Mutex
	peers map[string]*peerFailures
}

type peerFailures struct {
	n    int
	last time.Time
}

func newFailures(base, max, memory time.Duration, limit int) *failures {
	return &failures{base: base, max: max, memory: memory, limit: limit, peers: make(map[string]*peerFailures)}
}

// delay is how long to hold back the answer to peer's registration.
func (f *failures) delay(peer string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.peers[peer]
	if p == nil {
		p = f.peers[overflowPeer]
		if p == nil || len(f.peers) < f.limit {
			return 0
		}
	}
	if now.Sub(p.last) > f.memory {
		return 0
	}
	return backoff(f.base, f.max, p.n)
}

// fail records one authentication failure of peer.
func (f *failures) fail(peer string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.peers[peer]
	if p == nil {
		if len(f.peers) >= f.limit {
			f.sweep(now)
		}
		if len(f.peers) >= f.limit {
			peer = overflowPeer
			p = f.peers[peer]
		}
		if p == nil {
			p = &peerFailures{}
			f.peers[peer] = p
		}
	}
	if now.Sub(p.last) > f.memory {
		p.n = 0
	}
	p.n++
	p.last = now
}

// forget clears peer's failures after a successful registration.
func (f *failures) forget(peer string) {
	f.mu.Lock()
	delete(f.peers, peer)
	f.mu.Unlock()
}

// sweep drops entries older than the memory. Called with f.mu held, only
// when the table is full, so its cost is paid by the flood that filled it.
func (f *failures) sweep(now time.Time) {
	for k, p := range f.peers {
		if now.Sub(p.last) > f.memory {
			delete(f.peers, k)
		}
	}
}

// size is the number of tracked peers (tests).
func (f *failures) size() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.peers)
}

// backoff is base·2^(n-1) capped at max; 0 for n <= 0.
func backoff(base, max time.Duration, n int) time.Duration {
	if n <= 0 {
		return 0
	}
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return d
}
