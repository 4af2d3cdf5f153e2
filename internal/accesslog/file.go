package accesslog

import (
	"errors"
	"os"
	"sync"
)

// fileMode is the access log file's permission when it is created: the
// lines carry client addresses and paths.
const fileMode = 0o640

// File is an access log file, appended to, that Reopen opens again at
// its path: after a rotation renamed it (logrotate without
// copytruncate), lines go to a new file at the path. Writes and Reopen
// are safe for concurrent use; a line is written whole to one file.
type File struct {
	path string
	mu   sync.Mutex
	f    *os.File
}

// OpenFile opens (or creates) path for appending.
func OpenFile(path string) (*File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, fileMode)
	if err != nil {
		return nil, err
	}
	return &File{path: path, f: f}, nil
}

// Path is the file's path.
func (f *File) Path() string { return f.path }

// Write implements io.Writer.
func (f *File) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return 0, os.ErrClosed
	}
	return f.f.Write(p)
}

// Reopen opens the path anew and closes the file written so far. When
// the path cannot be opened, lines keep going to the old file and the
// error is returned.
func (f *File) Reopen() error {
	nf, err := os.OpenFile(f.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, fileMode)
	if err != nil {
		return err
	}
	f.mu.Lock()
	old := f.f
	if old != nil {
		f.f = nf
	}
	f.mu.Unlock()
	if old == nil {
		_ = nf.Close()
		return os.ErrClosed
	}
	return old.Close()
}

// Close closes the file; later writes fail.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.f == nil {
		return errors.New("accesslog: file already closed")
	}
	err := f.f.Close()
	f.f = nil
	return err
}
