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

// noTokens stands in for an unknown agent_id's tokens: checking the
// offered token against it costs what a known id's check costs.
var noTokens = tokenSet{hashes: [][sha256.Size]byte{{}}}

// overflowPeer is the shared entry of keys that found the table full.
const overflowPeer = "\x00overflow"

// failKey is the failure table's key: the peer (see peerKey) and the
// agent_id it tried to register.
func failKey(peer, agentID string) string { return peer + "\x00" + agentID }

// failures remembers authentication failures per (peer, agent_id) and
// turns them into an exponential delay before the next refusal to that
// key is answered.
//
// Only refusals wait: the token is checked first, and a valid one is
// accepted at once without consulting the table, so no flood of failures
// from a shared address (a NAT, a node) can hold back a correctly tokened
// agent, and failures of one agent_id do not slow another. The speed of an
// answer tells an attacker nothing it can use: only a correct token is
// answered fast, and an unknown agent_id is refused, counted and delayed
// exactly like a wrong token. A success does not reset the key either, so
// that whoever else fails under it from the same address keeps its delay.
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

// delay is how long the next refusal to key would be held back.
func (f *failures) delay(key string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.delayLocked(key, now)
}

func (f *failures) delayLocked(key string, now time.Time) time.Duration {
	p := f.peers[key]
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

// fail records one authentication failure of key.
func (f *failures) fail(key string, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failLocked(key, now)
}

func (f *failures) failLocked(key string, now time.Time) {
	p := f.peers[key]
	if p == nil {
		if len(f.peers) >= f.limit {
			f.sweep(now)
		}
		if len(f.peers) >= f.limit {
			key = overflowPeer
			p = f.peers[key]
		}
		if p == nil {
			p = &peerFailures{}
			f.peers[key] = p
		}
	}
	if now.Sub(p.last) > f.memory {
		p.n = 0
	}
	p.n++
	p.last = now
}

// penalize records a failure of key and returns how long to hold back its
// refusal: the delay earned by key's earlier failures, so that a first
// failure is answered at once. One lock for both, so that concurrent
// failures of one key each see the ones before them.
func (f *failures) penalize(key string, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	d := f.delayLocked(key, now)
	f.failLocked(key, now)
	return d
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

// size is the number of tracked keys (tests).
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
