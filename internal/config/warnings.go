package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Warning is a configuration that is valid but probably not what was
// meant, at a key: check-config prints it, and run and reload log it,
// without refusing the file.
type Warning struct {
	// Line is the key's line in the file (0 when unknown).
	Line int
	// Path is the key ("agents[0].timeouts.message").
	Path string
	// Msg says what is wrong and what to do about it.
	Msg string
}

// String formats w as errors are: "config: line 12: agents[0].timeouts.message: …".
func (w Warning) String() string {
	var b strings.Builder
	b.WriteString("config: ")
	if w.Line > 0 {
		b.WriteString("line " + strconv.Itoa(w.Line) + ": ")
	}
	if w.Path != "" {
		b.WriteString(w.Path + ": ")
	}
	b.WriteString(w.Msg)
	return b.String()
}

// WarnAt returns a Warning at path, with the line of path or of its
// nearest parent present in the file.
func (c *Config) WarnAt(path, format string, args ...any) Warning {
	return Warning{Line: c.lineOf(path), Path: path, Msg: fmt.Sprintf(format, args...)}
}

// ErrorAt returns err as an invalid-configuration *Error at path (and
// its line), for the checks made outside this package: the files and
// directories the configuration names.
func (c *Config) ErrorAt(path string, err error) error {
	return &Error{Line: c.lineOf(path), Path: path, Msg: err.Error(), kind: ErrConfigInvalid}
}

// Warnings returns what the configuration alone tells is probably wrong
// (call it on a validated Config): an agent's message timeout above its
// request budget, agents no route uses, and body policies that cannot
// act. They never make a configuration invalid. What depends on the
// machine (files, memory limits) or on a transport's options is checked
// by package supervisor.
func (c *Config) Warnings() []Warning {
	var out []Warning
	used := map[string]bool{}
	for i := range c.Routes {
		r := &c.Routes[i]
		for j := range r.Agents {
			ra := &r.Agents[j]
			used[ra.Name] = true
			a := c.Agent(ra.Name)
			if a == nil {
				continue
			}
			ap := fmt.Sprintf("routes[%d].agents[%d]", i, j)
			if ra.Timeout > 0 && ra.Timeout < a.Timeouts.Message {
				out = append(out, c.WarnAt(ap+".timeout",
					"%v is below agent %q's timeouts.message (%v): the request's budget runs out before one reply is late, so a slow reply times out at %v", ra.Timeout, a.Name, a.Timeouts.Message, ra.Timeout))
			}
			p := c.Policy(ra)
			if p.ResponseBody.OverLimit == OverLimitPrefix && p.ResponseBody.Mode != BodyNone {
				key := fmt.Sprintf("agents[%d].response_body.over_limit", c.agentIndex(a.Name))
				if ra.ResponseBody != nil && ra.ResponseBody.OverLimit != "" {
					key = ap + ".response_body.over_limit"
				}
				out = append(out, c.WarnAt(key,
					"prefix applies to request bodies: a response body over the limit on route %q passes uninspected, as with skip", r.Name))
			}
		}
	}
	for i := range c.Agents {
		a := &c.Agents[i]
		p := fmt.Sprintf("agents[%d]", i)
		if a.Timeouts.Message > a.Timeouts.Request {
			out = append(out, c.WarnAt(p+".timeouts.message",
				"%v is above timeouts.request (%v): a request's budget runs out before one reply is late, so the message timeout never applies; keep message below request", a.Timeouts.Message, a.Timeouts.Request))
		}
		if !used[a.Name] {
			out = append(out, c.WarnAt(p+".name",
				"agent %q is on no route: it is connected to but never consulted; add it to a route's agents or remove it", a.Name))
		}
	}
	out = append(out, c.routeWarnings()...)
	return out
}

func (c *Config) agentIndex(name string) int {
	for i := range c.Agents {
		if c.Agents[i].Name == name {
			return i
		}
	}
	return -1
}
