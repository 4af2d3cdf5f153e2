package config

import (
	"fmt"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Size is a byte count; in YAML a number of bytes or a string such as
// "64KiB", "1MiB", "2GiB" (1024-based) or "1MB" (1000-based).
type Size int64

// ParseSize parses a size as written in the configuration.
func ParseSize(s string) (Size, error) {
	t := strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range sizeUnits {
		if strings.HasSuffix(t, u.suffix) {
			mult = u.mult
			t = strings.TrimSpace(strings.TrimSuffix(t, u.suffix))
			break
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid size %q (want bytes or a number with KiB, MiB, GiB, KB, MB, GB)", s)
	}
	if mult > 1 && n > (1<<62)/mult {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return Size(n * mult), nil
}

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30},
	{"KB", 1000}, {"MB", 1000 * 1000}, {"GB", 1000 * 1000 * 1000},
	{"B", 1},
}

// String formats s with the largest exact binary unit.
func (s Size) String() string {
	switch {
	case s != 0 && s%(1<<30) == 0:
		return strconv.FormatInt(int64(s)>>30, 10) + "GiB"
	case s != 0 && s%(1<<20) == 0:
		return strconv.FormatInt(int64(s)>>20, 10) + "MiB"
	case s != 0 && s%(1<<10) == 0:
		return strconv.FormatInt(int64(s)>>10, 10) + "KiB"
	}
	return strconv.FormatInt(int64(s), 10)
}

// Error is a configuration error at a key. Line is 0 when unknown.
type Error struct {
	Line int
	Path string
	Msg  string
	kind error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config: ")
	if e.Line > 0 {
		b.WriteString("line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(": ")
	}
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap returns ErrConfigSyntax or ErrConfigInvalid.
func (e *Error) Unwrap() error { return e.kind }

var (
	durationType   = reflect.TypeOf(time.Duration(0))
	sizeType       = reflect.TypeOf(Size(0))
	routeAgentType = reflect.TypeOf(RouteAgent{})
)

// decoder walks the yaml.Node tree into the Config structs by their yaml
// tags, so that unknown keys, duplicates and wrong shapes are reported
// with their line, and records the line of every key it sets.
type decoder struct {
	lines map[string]int
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) error {
	return &Error{Line: n.Line, Path: path, Msg: fmt.Sprintf(format, args...), kind: ErrConfigSyntax}
}

func (d *decoder) decode(n *yaml.Node, out any, path string) error {
	return d.value(n, reflect.ValueOf(out).Elem(), path)
}

func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if path != "" {
		d.lines[path] = n.Line
	}
	t := v.Type()
	switch {
	case t == durationType:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		dur, perr := time.ParseDuration(s)
		if perr != nil {
			return d.fail(n, path, "invalid duration %q (want e.g. 250ms, 5s, 1m)", s)
		}
		v.SetInt(int64(dur))
		return nil
	case t == sizeType:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		sz, perr := ParseSize(s)
		if perr != nil {
			return d.fail(n, path, "%v", perr)
		}
		v.SetInt(int64(sz))
		return nil
	case t == routeAgentType && n.Kind == yaml.ScalarNode:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		v.FieldByName("Name").SetString(s)
		d.lines[path+".name"] = n.Line
		return nil
	}
	switch t.Kind() {
	case reflect.String:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		v.SetString(s)
	case reflect.Bool:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		b, perr := strconv.ParseBool(s)
		if perr != nil {
			return d.fail(n, path, "invalid boolean %q (want true or false)", s)
		}
		v.SetBool(b)
	case reflect.Int:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		i, perr := strconv.Atoi(s)
		if perr != nil {
			return d.fail(n, path, "invalid integer %q", s)
		}
		v.SetInt(int64(i))
	case reflect.Float64:
		s, err := d.scalar(n, path)
		if err != nil {
			return err
		}
		f, perr := strconv.ParseFloat(s, 64)
		if perr != nil {
			return d.fail(n, path, "invalid number %q", s)
		}
		v.SetFloat(f)
	case reflect.Slice:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.SequenceNode {
			return d.fail(n, path, "expected a list, got %s", kindName(n))
		}
		s := reflect.MakeSlice(t, len(n.Content), len(n.Content))
		for i, c := range n.Content {
			if err := d.value(c, s.Index(i), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		v.Set(s)
	case reflect.Map:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		if n.Kind != yaml.MappingNode || t.Key().Kind() != reflect.String || t.Elem().Kind() != reflect.String {
			return d.fail(n, path, "expected a mapping of strings, got %s", kindName(n))
		}
		m := reflect.MakeMapWithSize(t, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			kp := path + "." + k.Value
			if m.MapIndex(reflect.ValueOf(k.Value)).IsValid() {
				return d.fail(k, kp, "duplicate key")
			}
			s, err := d.scalar(val, kp)
			if err != nil {
				return err
			}
			d.lines[kp] = k.Line
			m.SetMapIndex(reflect.ValueOf(k.Value), reflect.ValueOf(s))
		}
		v.Set(m)
	case reflect.Pointer:
		if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
			return nil
		}
		p := reflect.New(t.Elem())
		if err := d.value(n, p.Elem(), path); err != nil {
			return err
		}
		v.Set(p)
	case reflect.Struct:
		return d.mapping(n, v, path)
	default:
		return d.fail(n, path, "unsupported field type %s", t)
	}
	return nil
}

func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) error {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return d.fail(n, path, "expected a mapping, got %s", kindName(n))
	}
	t := v.Type()
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		kp := k.Value
		if path != "" {
			kp = path + "." + k.Value
		}
		if k.Kind != yaml.ScalarNode {
			return d.fail(k, path, "keys must be plain names")
		}
		if seen[k.Value] {
			return d.fail(k, kp, "duplicate key")
		}
		seen[k.Value] = true
		f, ok := fieldByTag(t, k.Value)
		if !ok {
			return d.fail(k, kp, "unknown key (known: %s)", strings.Join(tagNames(t), ", "))
		}
		if err := d.value(val, v.FieldByIndex(f.Index), kp); err != nil {
			return err
		}
		// The key's own line is more useful than the value's (a nested
		// mapping starts on the next line).
		d.lines[kp] = k.Line
	}
	return nil
}

func (d *decoder) scalar(n *yaml.Node, path string) (string, error) {
	if n.Kind != yaml.ScalarNode {
		return "", d.fail(n, path, "expected a single value, got %s", kindName(n))
	}
	if n.Tag == "!!null" {
		return "", nil
	}
	return n.Value, nil
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "nothing"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func fieldByTag(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if f.IsExported() && yamlName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

func tagNames(t reflect.Type) []string {
	var names []string
	for i := 0; i < t.NumField(); i++ {
		if f := t.Field(i); f.IsExported() {
			names = append(names, yamlName(f))
		}
	}
	sort.Strings(names)
	return names
}

func yamlName(f reflect.StructField) string {
	tag := f.Tag.Get("yaml")
	if name, _, _ := strings.Cut(tag, ","); name != "" {
		return name
	}
	return strings.ToLower(f.Name)
}
