package supervisor

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/zentinelproxy/sidecar/internal/config"
	"github.com/zentinelproxy/sidecar/internal/transports"
)

// Warnings returns what is probably wrong in a loaded configuration
// without making it invalid: the configuration's own warnings
// (config.Config.Warnings), body policies an ext_proc agent's processing
// mode makes moot or an ext_authz or http_auth agent cannot use, a uds agent's address that exists but is not a
// socket, and body limits whose worst case does not fit the memory limit
// of the process's cgroup. check-config prints them; run logs them at
// start and at every reload.
func Warnings(cfg *config.Config) []config.Warning {
	return warnings(cfg, "/")
}

// warnings is Warnings with the file system's root (tests give another).
func warnings(cfg *config.Config, root string) []config.Warning {
	out := cfg.Warnings()
	out = append(out, extProcBodies(cfg)...)
	out = append(out, authzBodies(cfg)...)
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport != config.TransportUDS {
			continue
		}
		for j, addr := range a.Members() {
			path := strings.TrimPrefix(addr, "unix:")
			fi, err := os.Stat(path)
			if err != nil || fi.Mode()&os.ModeSocket != 0 {
				continue // not there yet (the agent creates it), or a socket
			}
			key := fmt.Sprintf("agents[%d].address", i)
			if j > 0 {
				key = fmt.Sprintf("agents[%d].addresses[%d]", i, j-1)
			}
			out = append(out, cfg.WarnAt(key, "%s exists and is not a socket (%s): connecting to it fails until the agent replaces it with its socket", path, fileKind(fi.Mode())))
		}
	}
	if limit, file, ok := memoryLimit(root); ok {
		if e := cfg.BufferEstimate(); e.Total > limit {
			terms := []string{fmt.Sprintf("%d requests × %s of bodies", e.Requests, mib(e.PerRequest))}
			if e.SendQueues > 0 {
				terms = append(terms, mib(e.SendQueues)+" of agent send queues")
			}
			if e.Shadow > 0 {
				terms = append(terms, mib(e.Shadow)+" of shadow queues")
			}
			key := e.Key
			if key == "" {
				key = "agents" // queues alone
			}
			out = append(out, cfg.WarnAt(key,
				"in the worst case bodies and agent queues hold %s (%s), above the memory limit of %s (%s): lower max_in_flight and max_queue, the listeners' max_connections or the body limits (docs/configuration.md#memory)",
				mib(e.Total), strings.Join(terms, ", "), mib(limit), file))
		}
	}
	return out
}

// extProcBodies warns about a body policy of an ext_proc agent whose
// processing mode (and allowed overrides) never sends that body: the
// agent's capabilities follow from its options alone, so the policy
// cannot act. Other transports declare theirs at the handshake.
func extProcBodies(cfg *config.Config) []config.Warning {
	var out []config.Warning
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		for j := range r.Agents {
			ra := &r.Agents[j]
			a := cfg.Agent(ra.Name)
			if a == nil || a.Transport != config.TransportExtProc {
				continue
			}
			c, err := transports.ExtProcConfig(a, zerolog.Nop())
			if err != nil {
				continue // Check reports it
			}
			caps := c.Capabilities()
			p := cfg.Policy(ra)
			ai := agentIndex(cfg, a.Name)
			for _, d := range []struct {
				name     string
				mode     string
				override *config.BodyPolicy
				sent     bool
			}{
				{"request_body", p.RequestBody.Mode, ra.RequestBody, caps.HandlesRequestBody},
				{"response_body", p.ResponseBody.Mode, ra.ResponseBody, caps.HandlesResponseBody},
			} {
				if d.sent || (d.mode != config.BodyBuffered && d.mode != config.BodyStreaming) {
					continue
				}
				key := fmt.Sprintf("agents[%d].%s.mode", ai, d.name)
				if d.override != nil && d.override.Mode != "" {
					key = fmt.Sprintf("routes[%d].agents[%d].%s.mode", i, j, d.name)
				}
				out = append(out, cfg.WarnAt(key,
					"%s on route %q has no effect: ext_proc agent %q's processing_mode sends it no %s (%s_mode NONE, no override allowed); set %s_mode in options.processing_mode",
					d.mode, r.Name, a.Name, strings.ReplaceAll(d.name, "_", " "), d.name, d.name))
			}
		}
	}
	return out
}

// authzBodies warns about a body policy of an ext_authz or http_auth
// agent that takes no such body: they are asked once, at the request
// headers (an ext_authz agent with with_request_body also at the end of
// the request body), never about the response.
func authzBodies(cfg *config.Config) []config.Warning {
	var out []config.Warning
	takes := func(a *config.Agent, dir string) bool {
		if a.Transport != config.TransportExtAuthz || dir != "request_body" {
			return false
		}
		c, err := transports.ExtAuthzConfig(a, zerolog.Nop())
		return err == nil && c.WithRequestBody
	}
	warn := func(key string, a *config.Agent, dir, mode string) {
		why := "it is asked once, at the request headers"
		if a.Transport == config.TransportExtAuthz && dir == "request_body" {
			why += ` (options.with_request_body: "true" sends it the request body)`
		}
		out = append(out, cfg.WarnAt(key, "%s has no effect: %s agent %q takes no %s: %s",
			mode, a.Transport, a.Name, strings.ReplaceAll(dir, "_", " "), why))
	}
	active := func(mode string) bool { return mode == config.BodyBuffered || mode == config.BodyStreaming }
	for i := range cfg.Agents {
		a := &cfg.Agents[i]
		if a.Transport != config.TransportExtAuthz && a.Transport != config.TransportHTTPAuth {
			continue
		}
		for _, d := range []struct {
			dir  string
			mode string
		}{{"request_body", a.RequestBody.Mode}, {"response_body", a.ResponseBody.Mode}} {
			if active(d.mode) && !takes(a, d.dir) {
				warn(fmt.Sprintf("agents[%d].%s.mode", i, d.dir), a, d.dir, d.mode)
			}
		}
	}
	for i := range cfg.Routes {
		r := &cfg.Routes[i]
		for j := range r.Agents {
			ra := &r.Agents[j]
			a := cfg.Agent(ra.Name)
			if a == nil || (a.Transport != config.TransportExtAuthz && a.Transport != config.TransportHTTPAuth) {
				continue
			}
			for _, d := range []struct {
				dir string
				o   *config.BodyPolicy
			}{{"request_body", ra.RequestBody}, {"response_body", ra.ResponseBody}} {
				if d.o != nil && active(d.o.Mode) && !takes(a, d.dir) {
					warn(fmt.Sprintf("routes[%d].agents[%d].%s.mode", i, j, d.dir), a, d.dir, d.o.Mode)
				}
			}
		}
	}
	return out
}

func agentIndex(cfg *config.Config, name string) int {
	for i := range cfg.Agents {
		if cfg.Agents[i].Name == name {
			return i
		}
	}
	return -1
}

func fileKind(m os.FileMode) string {
	switch {
	case m.IsRegular():
		return "a regular file"
	case m.IsDir():
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a named pipe"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}

func mib(n int64) string {
	if n < 1<<20 {
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n>>20, 10) + " MiB"
}

// unlimited is where a cgroup v1 limit means none (the kernel reports
// about 2^63 rounded down to a page).
const unlimited = 1 << 62

// memoryLimit returns the lowest memory limit of the process's cgroup
// and its ancestors, and the file that sets it: cgroup v2 memory.max,
// or cgroup v1 memory.limit_in_bytes. ok is false without a limit.
func memoryLimit(root string) (limit int64, file string, ok bool) {
	f, err := os.Open(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		return 0, "", false
	}
	defer f.Close()
	var v2, v1 string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// hierarchy-ID:controller-list:cgroup-path
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case parts[0] == "0" && parts[1] == "":
			v2 = parts[2]
		case hasController(parts[1], "memory"):
			v1 = parts[2]
		}
	}
	check := func(base, rel, name string) {
		// The cgroup and each ancestor: a parent's limit binds too. In a
		// container the mounted hierarchy starts at the container's own
		// cgroup, so a path of the host's namespace is not found and its
		// ancestors, up to the mount's root, are.
		for dir := filepath.Clean("/" + rel); ; dir = filepath.Dir(dir) {
			p := filepath.Join(root, base, dir, name)
			if n, isSet := readLimit(p); isSet && (!ok || n < limit) {
				limit, file, ok = n, filepath.Join("/", base, dir, name), true
			}
			if dir == "/" {
				return
			}
		}
	}
	if v2 != "" {
		check("sys/fs/cgroup", v2, "memory.max")
	}
	if v1 != "" {
		check("sys/fs/cgroup/memory", v1, "memory.limit_in_bytes")
	}
	return limit, file, ok
}

func hasController(list, c string) bool {
	for _, x := range strings.Split(list, ",") {
		if x == c {
			return true
		}
	}
	return false
}

// readLimit reads a memory limit file: a number of bytes, or "max".
func readLimit(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= unlimited {
		return 0, false // "max", or v1's "unlimited"
	}
	return n, true
}
