//go:build !unix

package supervisor

const (
	accessWrite  = 2
	accessSearch = 1
)

// access cannot ask the system here; the open at start decides.
func access(string, uint32) error { return nil }
