package demoagent

import (
	"sync"
	"time"
)

// redactor masks a word in a body that arrives in chunks. A word may be
// split across chunks, so a chunk that ends with the beginning of the word
// ("...sec") is forwarded without those bytes, which are sent with the next
// chunk once it shows whether they are the word; the last chunk flushes
// them. The body's total size is unchanged; only
// the split between chunks moves.
type redactor struct {
	word    []byte // lower-case
	mask    byte
	work    []byte // held-back bytes + current chunk; the reply points into it
	pending []byte // bytes held back for the next chunk
	seen    time.Time
}

var redactorPool = sync.Pool{New: func() any { return new(redactor) }}

func (r *redactor) reset(word []byte, mask byte) {
	r.word, r.mask, r.work, r.pending = word, mask, r.work[:0], r.pending[:0]
}

// write takes the next chunk and returns the bytes to forward in its place
// (valid until the next write) and whether they differ from data.
func (r *redactor) write(data []byte, last bool) (out []byte, changed bool) {
	held := len(r.pending)
	buf := append(append(r.work[:0], r.pending...), data...)
	r.work = buf
	n := len(r.word)

	masked := false
	end := 0 // end of the last match
	for i := 0; i+n <= len(buf); {
		if r.matchAt(buf, i) {
			for k := i; k < i+n; k++ {
				buf[k] = r.mask
			}
			i += n
			end = i
			masked = true
			continue
		}
		i++
	}

	cut := len(buf)
	if !last {
		// A match that the next chunk completes begins at len(buf)-n+1 or
		// later, where the rest of buf is a prefix of the word: hold those
		// bytes back.
		for p := max(len(buf)-n+1, end, 0); p < len(buf); p++ {
			if r.prefixAt(buf, p) {
				cut = p
				break
			}
		}
	}
	r.pending = append(r.pending[:0], buf[cut:]...)
	if held == 0 && !masked && cut == len(buf) {
		return data, false
	}
	return buf[:cut], true
}

// prefixAt reports whether b[i:] is a prefix of the word.
func (r *redactor) prefixAt(b []byte, i int) bool {
	for k, c := range b[i:] {
		if lower(c) != r.word[k] {
			return false
		}
	}
	return true
}

func (r *redactor) matchAt(b []byte, i int) bool {
	for k, c := range r.word {
		if lower(b[i+k]) != c {
			return false
		}
	}
	return true
}
