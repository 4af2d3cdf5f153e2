package ratelimit

import (
	"testing"
	"unsafe"
)

// TestShardSize: a shard fills a cache line pair (its padding says so).
func TestShardSize(t *testing.T) {
	if n := unsafe.Sizeof(shard{}); n != 128 {
		t.Fatalf("shard is %d bytes, want 128", n)
	}
}
