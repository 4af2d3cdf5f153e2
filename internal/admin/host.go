package admin

import (
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"
)

// refusedHost is the reason label of requests refused for their Host.
const refusedHost = "host"

// checkHost answers 421 to a request whose Host the admin listener does
// not answer to, before any endpoint runs.
//
// DNS rebinding: a page on evil.example re-resolves its own name to
// 127.0.0.1, and the browser then lets it read what this listener answers,
// sending "Host: evil.example". Its Host is always the attacker's name;
// an IP literal, localhost or a name the operator listed never is.
func (s *Server) checkHost(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.hostAllowed(r.Host) {
			next.ServeHTTP(w, r)
			return
		}
		s.refused.WithLabelValues(refusedHost).Inc()
		s.refusedHost.Add(1)
		if ok, suppressed := s.refuseLog.allow(time.Now()); ok {
			s.cfg.Log.Warn().Str("host", clip(r.Host)).Str("path", clip(r.URL.Path)).Str("remote", r.RemoteAddr).
				Int("suppressed_since", suppressed).
				Msg("admin request refused: Host is not an IP address, localhost or in admin.allowed_hosts")
		}
		w.Header().Set("Connection", "close")
		writeJSON(w, http.StatusMisdirectedRequest, map[string]string{"error": "misdirected request"})
	})
}

// hostAllowed reports whether h, a request's Host, is an IP literal (v4,
// or v6 in brackets), localhost or an allowed name, with or without a port.
func (s *Server) hostAllowed(h string) bool {
	var host, port string
	bracketed := strings.HasPrefix(h, "[")
	if bracketed {
		end := strings.IndexByte(h, ']')
		if end < 0 {
			return false
		}
		host, port = h[1:end], h[end+1:]
	} else {
		i := strings.IndexByte(h, ':')
		if i < 0 {
			i = len(h)
		}
		host, port = h[:i], h[i:]
	}
	if host == "" || port != "" && (port[0] != ':' || !validPort(port[1:])) {
		return false
	}
	if bracketed {
		a, err := netip.ParseAddr(host)
		return err == nil && a.Is6()
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Is4()
	}
	name := canonicalHost(host)
	return name == "localhost" || slices.Contains(s.cfg.AllowedHosts, name)
}

// validPort accepts what a URL's authority allows after the colon: up to
// five digits, or none.
func validPort(p string) bool {
	if len(p) > 5 {
		return false
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return false
		}
	}
	return true
}

// canonicalHost is a host name as compared: lower case, without the
// trailing dot of a fully qualified name.
func canonicalHost(h string) string {
	return strings.ToLower(strings.TrimSuffix(h, "."))
}

// clip bounds request-provided text before it reaches the log.
func clip(s string) string {
	if len(s) > 128 {
		return s[:128] + "…"
	}
	return s
}

// refuseLogEvery is the least time between two log lines about refused
// requests; the ones between are counted in the next line.
const refuseLogEvery = 10 * time.Second

// logLimit lets one line through per refuseLogEvery.
type logLimit struct {
	mu         sync.Mutex
	next       time.Time
	suppressed int
}

func (g *logLimit) allow(now time.Time) (bool, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now.Before(g.next) {
		g.suppressed++
		return false, 0
	}
	g.next = now.Add(refuseLogEvery)
	n := g.suppressed
	g.suppressed = 0
	return true, n
}
