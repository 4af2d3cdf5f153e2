package protocol

import "encoding/binary"

// b64 maps the standard base64 alphabet to its 6-bit values; 0xFF marks
// everything else (padding included, which is stripped first).
var b64 = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xFF
	}
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for i := 0; i < len(alphabet); i++ {
		t[alphabet[i]] = byte(i)
	}
	return t
}()

// decodeBase64InPlace decodes standard base64 from b into b itself and
// returns the decoded length. encoding/base64 does not document that its
// decoder tolerates overlapping buffers, hence this small one: the write
// index stays at 3/4 of the read index, so unread input is never
// overwritten. Padding may be present (len%4 == 0) or omitted; a lone
// trailing symbol, misplaced padding and any byte outside the alphabet
// (including CR/LF) are rejected. Unused low bits of the last symbol are
// ignored, as by base64.StdEncoding.
//
// On failure it returns ok == false and untouched, an index such that
// b[untouched:] still holds the original input (the bytes before it may
// have been overwritten with decoded data, but were valid symbols).
func decodeBase64InPlace(b []byte) (n int, ok bool, untouched int) {
	n = len(b)
	if n%4 == 0 && n > 0 && b[n-1] == '=' {
		n--
		if b[n-1] == '=' {
			n--
		}
	}
	if n%4 == 1 {
		return 0, false, 0
	}
	r, w := 0, 0
	// Eight symbols → six bytes, stored as one 8-byte write whose last two
	// bytes are overwritten by the next round (w+8 <= r+8 <= n always).
	for r+8 <= n {
		src := b[r : r+8 : r+8]
		a0, a1, a2, a3 := b64[src[0]], b64[src[1]], b64[src[2]], b64[src[3]]
		a4, a5, a6, a7 := b64[src[4]], b64[src[5]], b64[src[6]], b64[src[7]]
		if (a0|a1|a2|a3|a4|a5|a6|a7)&0xC0 != 0 {
			return 0, false, r
		}
		v := uint64(a0)<<58 | uint64(a1)<<52 | uint64(a2)<<46 | uint64(a3)<<40 |
			uint64(a4)<<34 | uint64(a5)<<28 | uint64(a6)<<22 | uint64(a7)<<16
		binary.BigEndian.PutUint64(b[w:], v)
		r += 8
		w += 6
	}
	for r+4 <= n {
		a0, a1, a2, a3 := b64[b[r]], b64[b[r+1]], b64[b[r+2]], b64[b[r+3]]
		if (a0|a1|a2|a3)&0xC0 != 0 {
			return 0, false, r
		}
		v := uint32(a0)<<18 | uint32(a1)<<12 | uint32(a2)<<6 | uint32(a3)
		b[w], b[w+1], b[w+2] = byte(v>>16), byte(v>>8), byte(v)
		r += 4
		w += 3
	}
	switch n - r {
	case 2:
		a0, a1 := b64[b[r]], b64[b[r+1]]
		if (a0|a1)&0xC0 != 0 {
			return 0, false, r
		}
		b[w] = a0<<2 | a1>>4
		w++
	case 3:
		a0, a1, a2 := b64[b[r]], b64[b[r+1]], b64[b[r+2]]
		if (a0|a1|a2)&0xC0 != 0 {
			return 0, false, r
		}
		b[w], b[w+1] = a0<<2|a1>>4, a1<<4|a2>>2
		w += 2
	}
	return w, true, 0
}
