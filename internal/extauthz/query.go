package extauthz

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"

	"github.com/zentinelproxy/sidecar/internal/authcall"
)

// The query of an OK answer's query_parameters_to_set and
// query_parameters_to_remove is rebuilt as Envoy's ext_authz filter
// rebuilds it (Http::Utility::QueryParamsMulti: parseQueryString,
// overwrite, remove, replaceQueryString): the target's query is split at
// '&' into parameters, each a name up to its first '=' and a value (""
// without one), neither decoded; each parameter to set replaces every
// value of its name (or is added), each to remove drops every value of
// its name; the query is then written sorted by name (byte order), the
// values of a name in their order, each as name=value joined by '&', and
// a query left without parameters is dropped with its '?'. The path is
// not touched. An answer with neither list leaves the target as it is.
//
// A parameter to set is refused (the answer fails the request, counted
// invalid_query_parameters) unless its name is not empty and both are
// visible ASCII without '&' or '#' (nor '=' in the name): such bytes
// would change the query's structure or end the target. Envoy checks the
// same with validate_mutations (percent-encoded names and values); the
// dataplane holds the resulting target to the agent's limits.

// queryParam is one parameter of a query: its name and values.
type queryParam struct {
	name   string
	values []string
}

// rewriteQuery returns the query (without '?') of uri once set and
// remove are applied, appended to dst.
func rewriteQuery(dst, uri []byte, set []*corev3.QueryParameter, remove []string) ([]byte, error) {
	for _, p := range set {
		if err := checkQueryParam(p.GetKey(), p.GetValue()); err != nil {
			return dst, err
		}
	}
	var params []queryParam
	find := func(name string) int {
		i, ok := slices.BinarySearchFunc(params, name, func(p queryParam, n string) int { return strings.Compare(p.name, n) })
		if !ok {
			return -i - 1
		}
		return i
	}
	put := func(name, value string, overwrite bool) {
		i := find(name)
		switch {
		case i < 0:
			i = -i - 1
			params = slices.Insert(params, i, queryParam{name: name, values: []string{value}})
		case overwrite:
			params[i].values = append(params[i].values[:0], value)
		default:
			params[i].values = append(params[i].values, value)
		}
	}
	if _, q, ok := bytes.Cut(uri, []byte("?")); ok {
		for len(q) > 0 {
			var p []byte
			p, q, _ = bytes.Cut(q, []byte("&"))
			name, value, _ := bytes.Cut(p, []byte("="))
			put(string(name), string(value), false)
		}
	}
	for _, p := range set {
		put(p.GetKey(), p.GetValue(), true)
	}
	for _, name := range remove {
		if i := find(name); i >= 0 {
			params = slices.Delete(params, i, i+1)
		}
	}
	first := true
	for _, p := range params {
		for _, v := range p.values {
			if !first {
				dst = append(dst, '&')
			}
			first = false
			dst = append(dst, p.name...)
			dst = append(dst, '=')
			dst = append(dst, v...)
		}
	}
	return dst, nil
}

// checkQueryParam refuses a parameter to set that would not be one
// parameter of the target's query.
func checkQueryParam(name, value string) error {
	if name == "" {
		return fmt.Errorf("%w: query parameter to set with an empty name", authcall.ErrBadAnswer)
	}
	for i := range len(name) + len(value) {
		var c byte
		if i < len(name) {
			c = name[i]
		} else {
			c = value[i-len(name)]
		}
		if c <= ' ' || c >= 0x7f || c == '&' || c == '#' || (c == '=' && i < len(name)) {
			return fmt.Errorf("%w: query parameter to set %q: byte %#x is not allowed (percent-encode it)", authcall.ErrBadAnswer, clip(name), c)
		}
	}
	return nil
}
