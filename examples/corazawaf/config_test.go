package corazawaf

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseExclusions(t *testing.T) {
	got, err := ParseExclusions(strings.NewReader("# comment\n913100, 942100-942199\n\n  920350\t# trailing\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []RuleRange{{913100, 913100}, {942100, 942199}, {920350, 920350}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	if s := got[1].String(); s != "942100-942199" {
		t.Errorf("String %q", s)
	}
	for _, bad := range []string{"abc", "0", "-5", "5-", "942199-942100", "+1", "123456789", "1--2", "942100 x"} {
		_, err := ParseExclusions(strings.NewReader("\n" + bad))
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("%q: err %v, want ErrConfig on line 2", bad, err)
		}
	}
	long := strings.Repeat("1 ", maxExclusionLine)
	if _, err := ParseExclusions(strings.NewReader(long)); !errors.Is(err, ErrConfig) {
		t.Errorf("over-long line: err %v", err)
	}
}

func TestParseExclusionsFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "excl.txt")
	if err := os.WriteFile(p, []byte("942100\nnope\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseExclusionsFile(p); err == nil || !strings.Contains(err.Error(), p+": line 2") {
		t.Errorf("err %v, want the path and line 2", err)
	}
	if _, err := ParseExclusionsFile(p + ".missing"); !errors.Is(err, ErrConfig) {
		t.Errorf("missing file: err %v", err)
	}
}

func FuzzParseExclusions(f *testing.F) {
	for _, s := range []string{"", "913100", "942100-942199, 1\n# x\n", "1-1-1", "\x00,,\t-", "99999999", "-"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		rr, err := ParseExclusions(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error not ErrConfig: %v", err)
			}
			return
		}
		c := DefaultConfig()
		c.Exclusions = rr
		if err := c.Validate(); err != nil {
			t.Fatalf("parsed ranges do not validate: %v", err)
		}
		// What is parsed round-trips through its SecLang form.
		var b strings.Builder
		for _, r := range rr {
			b.WriteString(r.String() + "\n")
		}
		again, err := ParseExclusions(strings.NewReader(b.String()))
		if err != nil || !reflect.DeepEqual(again, rr) && len(rr) > 0 {
			t.Fatalf("round trip of %v: %v %v", rr, again, err)
		}
	})
}

func TestValidate(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"mode":       func(c *Config) { c.Mode = "off" },
		"paranoia":   func(c *Config) { c.ParanoiaLevel = 5 },
		"inbound":    func(c *Config) { c.InboundThreshold = 0 },
		"outbound":   func(c *Config) { c.OutboundThreshold = -1 },
		"body limit": func(c *Config) { c.BodyLimit = maxBodyLimit + 1 },
		"pending":    func(c *Config) { c.MaxPending = 0 },
		"ttl":        func(c *Config) { c.PendingTTL = time.Millisecond },
		"log rate":   func(c *Config) { c.LogRate = -1 },
		"no methods": func(c *Config) { c.AllowedMethods = nil },
		"method":     func(c *Config) { c.AllowedMethods = []string{"GET'"} },
		"ctype":      func(c *Config) { c.AllowedContentTypes = []string{"application/json'"} },
		"exclusion":  func(c *Config) { c.Exclusions = []RuleRange{{5, 4}} },
	} {
		c := DefaultConfig()
		mut(&c)
		if err := c.Validate(); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: err %v, want ErrConfig", name, err)
		}
		if _, err := New(c, nil); !errors.Is(err, ErrConfig) {
			t.Errorf("%s: New err %v, want ErrConfig", name, err)
		}
	}
	c := DefaultConfig()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.ExtraDirectives = "SecRule ARGS \"@rx x\" \"id:1,phase:2,deny,status:403" // unterminated
	if _, err := New(c, nil); !errors.Is(err, ErrRules) {
		t.Errorf("bad directives: err %v, want ErrRules", err)
	}
}
