package supervisor

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/zentinelproxy/sidecar/internal/config"
)

// Preflight checks what a start would open and can be checked without
// opening it for good, so that check-config refuses what run would: the
// access log's file (writable, or creatable in an existing writable
// directory), the directories of the Unix sockets the sidecar listens on
// (listeners, reverse agents) and the files the transports read at start
// (gRPC and ext_proc TLS files, reverse token files and variables, TLS
// files). The TLS files of listeners and upstreams are read by the
// configuration's own validation. Errors wrap config.ErrConfigInvalid
// and name the key and its line. Bound ports cannot be checked without
// binding them.
func Preflight(cfg *config.Config) error {
	if l := &cfg.AccessLog; l.Enabled && l.Output != config.AccessLogStdout && l.Output != config.AccessLogStderr {
		if err := creatable(l.Output); err != nil {
			return cfg.ErrorAt("access_log.output", fmt.Errorf("access log %s: %w", l.Output, err))
		}
	}
	for i := range cfg.Listeners {
		if p, ok := strings.CutPrefix(cfg.Listeners[i].Address, "unix:"); ok {
			if err := socketPath(p); err != nil {
				return cfg.ErrorAt(fmt.Sprintf("listeners[%d].address", i), err)
			}
		}
	}
	reverseSeen := map[string]bool{}
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		p := fmt.Sprintf("agents[%d]", i)
		switch a.Transport {
		case config.TransportGRPC, config.TransportExtProc, config.TransportExtAuthz, config.TransportHTTPAuth:
			if err := fileOptions(cfg, p, a.Options, "tls_ca_file", "tls_cert_file", "tls_key_file"); err != nil {
				return err
			}
		case config.TransportReverse:
			if sp, ok := strings.CutPrefix(a.Address, "unix:"); ok && !reverseSeen[a.Address] {
				reverseSeen[a.Address] = true
				if err := socketPath(sp); err != nil {
					return cfg.ErrorAt(p+".address", err)
				}
			}
			if err := fileOptions(cfg, p, a.Options, "tls_client_ca_file", "tls_cert_file", "tls_key_file"); err != nil {
				return err
			}
			if f := a.Options["token_file"]; f != "" {
				if err := tokenFile(f); err != nil {
					return cfg.ErrorAt(p+".options.token_file", err)
				}
			}
			if e := a.Options["token_env"]; e != "" {
				if v, ok := os.LookupEnv(e); !ok || strings.TrimSpace(v) == "" {
					return cfg.ErrorAt(p+".options.token_env", fmt.Errorf("environment variable %s is unset or empty", e))
				}
			}
		}
	}
	return nil
}

// fileOptions checks the TLS file options of an agent: the CA bundle
// holds a certificate, the certificate and key load as a pair.
func fileOptions(cfg *config.Config, p string, opts map[string]string, caKey, certKey, keyKey string) error {
	if f := opts[caKey]; f != "" {
		if _, err := config.LoadCertPool(f); err != nil {
			return cfg.ErrorAt(p+".options."+caKey, err)
		}
	}
	cert, key := opts[certKey], opts[keyKey]
	if cert != "" && key != "" {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return cfg.ErrorAt(p+".options."+certKey, fmt.Errorf("loading %s / %s: %w", cert, key, err))
		}
	}
	return nil
}

// maxTokenFile is the largest token file the reverse listener reads.
const maxTokenFile = 64 << 10

// tokenFile checks that a token file can be read and holds a token.
func tokenFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxTokenFile+1))
	switch {
	case err != nil:
		return fmt.Errorf("%s: %w", path, err)
	case len(b) > maxTokenFile:
		return fmt.Errorf("%s is larger than %d bytes", path, maxTokenFile)
	case strings.TrimSpace(string(b)) == "":
		return fmt.Errorf("%s is empty", path)
	}
	return nil
}

// creatable checks that path can be opened for appending: an existing
// file that is not a directory and is writable, or a new one in an
// existing directory that is writable.
func creatable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return errors.New("is a directory")
	case err == nil:
		if err := access(path, accessWrite); err != nil {
			return fmt.Errorf("not writable: %w", err)
		}
		return nil
	case !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
		return err
	}
	return writableDir(filepath.Dir(path))
}

// socketPath checks that a Unix socket can be created at path: its
// directory exists and is writable, and nothing but a (stale) socket is
// there already (unixsock.Listen never removes anything else).
func socketPath(path string) error {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket == 0 {
		return fmt.Errorf("%s exists and is not a socket (it is never removed)", path)
	}
	return writableDir(filepath.Dir(path))
}

func writableDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("directory %s does not exist", dir)
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := access(dir, accessWrite|accessSearch); err != nil {
		return fmt.Errorf("cannot create files in %s: %w", dir, err)
	}
	return nil
}
