package corazawaf

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// ErrConfig is returned (wrapped) for an unusable setting or exclusion.
var ErrConfig = errors.New("corazawaf: invalid config")

// Mode is what the agent does with a request the rules flag.
type Mode string

const (
	// ModeBlocking answers flagged requests with the rules' status (403).
	ModeBlocking Mode = "blocking"
	// ModeDetectionOnly lets flagged requests pass and only reports them
	// (audit field and log).
	ModeDetectionOnly Mode = "detection-only"
)

// Defaults of Config.
const (
	DefaultParanoiaLevel     = 1
	DefaultInboundThreshold  = 5
	DefaultOutboundThreshold = 4
	// DefaultBodyLimit matches the sidecar's default request_body limit.
	DefaultBodyLimit = 1 << 20
	// DefaultMaxPending bounds transactions waiting for their response: an
	// open CRS transaction holds about 200 KB, so 1024 of them about
	// 200 MB. It matches the sidecar's default max_in_flight.
	DefaultMaxPending = 1024
	// DefaultPendingTTL bounds the wait for a response's headers.
	DefaultPendingTTL = 2 * time.Minute
	// DefaultLogRate is the number of request log lines per second.
	DefaultLogRate = 10
	// maxBodyLimit keeps a body in memory: Coraza would spill to disk.
	maxBodyLimit = 64 << 20
	// maxRuleID is the largest id SecRule accepts in CRS practice.
	maxRuleID = 99_999_999
)

// Config tunes the agent. DefaultConfig returns the recommended settings.
type Config struct {
	// Mode is blocking or detection-only.
	Mode Mode
	// ParanoiaLevel is the CRS blocking paranoia level, 1 (fewest false
	// positives) to 4.
	ParanoiaLevel int
	// InboundThreshold and OutboundThreshold are the CRS anomaly scores at
	// which a request or a response is blocked (a critical match scores 5).
	InboundThreshold  int
	OutboundThreshold int
	// AllowedMethods are the HTTP methods CRS rule 911100 lets through.
	AllowedMethods []string
	// AllowedContentTypes are the request body types CRS rule 920420 lets
	// through (media types without parameters, lower case); empty keeps
	// CRS's list (forms, multipart, XML, JSON).
	AllowedContentTypes []string
	// Exclusions are rule ids or ranges removed from the rule set.
	Exclusions []RuleRange
	// BodyLimit is the request body size inspected; a larger body is
	// refused with 413 in blocking mode, inspected up to the limit in
	// detection-only mode. Keep it at or above the sidecar's
	// request_body limit for this agent.
	BodyLimit int
	// InspectResponse asks for response headers (CRS phases 3 and 4). The
	// transaction then stays open from the request until its response.
	InspectResponse bool
	// MaxPending bounds the transactions kept open between a request and its
	// response; beyond it the oldest is closed (and its response passes
	// uninspected).
	MaxPending int
	// PendingTTL closes a transaction whose response did not come in time:
	// the proxy does not say when it gave up on a request between events.
	PendingTTL time.Duration
	// LogRate is the number of per-request log lines per second; lines
	// over it are counted and reported in the next line logged.
	LogRate int
	// RxPreFilter turns on Coraza's @rx pre-filter (SecRxPreFilter): at
	// load time each CRS regular expression yields the literals and the
	// length any match needs, and an input without them skips the regular
	// expression. A necessary-condition check, it never turns a match
	// into a miss. It saves a tenth to a third of the CPU of a request
	// with arguments, more on long ones; Coraza calls it experimental.
	RxPreFilter bool
	// SetupDirectives are SecLang directives placed before the CRS rules,
	// as CRS's crs-setup.conf is: after crs-setup.conf.example and the
	// agent's own settings from the fields above (rules 900900–900903), so
	// that a SecAction here setting a tx variable (tx.allowed_methods,
	// tx.blocking_paranoia_level, tx.arg_length, …) takes effect and wins
	// over those fields. It may use the ids crs-setup.conf.example
	// documents (900000, 900200, …), except 900990, which that file sets.
	// Runtime rule exclusions (a SecRule with ctl:ruleRemoveById for a
	// path) go here too: they must run before the rule they remove.
	SetupDirectives string
	// ExtraDirectives are SecLang directives placed after the rule set and
	// the Exclusions: configure-time rule exclusions and changes, which
	// need the rules loaded (SecRuleRemoveById, SecRuleRemoveByTag,
	// SecRuleUpdateTargetById). A SecAction setting a CRS variable here
	// runs after the rules that read it: use SetupDirectives for that.
	ExtraDirectives string
}

// DefaultAllowedMethods are CRS's (GET HEAD POST OPTIONS) and those of
// JSON APIs (PUT PATCH DELETE).
func DefaultAllowedMethods() []string {
	return []string{"GET", "HEAD", "POST", "OPTIONS", "PUT", "PATCH", "DELETE"}
}

// DefaultConfig is blocking mode at paranoia level 1 with the CRS
// default thresholds.
func DefaultConfig() Config {
	return Config{
		Mode:              ModeBlocking,
		ParanoiaLevel:     DefaultParanoiaLevel,
		InboundThreshold:  DefaultInboundThreshold,
		OutboundThreshold: DefaultOutboundThreshold,
		AllowedMethods:    DefaultAllowedMethods(),
		BodyLimit:         DefaultBodyLimit,
		InspectResponse:   true,
		MaxPending:        DefaultMaxPending,
		PendingTTL:        DefaultPendingTTL,
		LogRate:           DefaultLogRate,
		RxPreFilter:       true,
	}
}

// Validate reports the first unusable setting.
func (c *Config) Validate() error {
	switch {
	case c.Mode != ModeBlocking && c.Mode != ModeDetectionOnly:
		return fmt.Errorf("%w: mode %q (want %s or %s)", ErrConfig, c.Mode, ModeBlocking, ModeDetectionOnly)
	case c.ParanoiaLevel < 1 || c.ParanoiaLevel > 4:
		return fmt.Errorf("%w: paranoia level %d (want 1 to 4)", ErrConfig, c.ParanoiaLevel)
	case c.InboundThreshold < 1 || c.InboundThreshold > 10000:
		return fmt.Errorf("%w: inbound threshold %d (want 1 to 10000)", ErrConfig, c.InboundThreshold)
	case c.OutboundThreshold < 1 || c.OutboundThreshold > 10000:
		return fmt.Errorf("%w: outbound threshold %d (want 1 to 10000)", ErrConfig, c.OutboundThreshold)
	case c.BodyLimit < 1 || c.BodyLimit > maxBodyLimit:
		return fmt.Errorf("%w: body limit %d (want 1 to %d bytes)", ErrConfig, c.BodyLimit, maxBodyLimit)
	case c.MaxPending < 1:
		return fmt.Errorf("%w: max pending %d (want at least 1)", ErrConfig, c.MaxPending)
	case c.PendingTTL < time.Second:
		return fmt.Errorf("%w: pending ttl %s (want at least 1s)", ErrConfig, c.PendingTTL)
	case c.LogRate < 0:
		return fmt.Errorf("%w: log rate %d (want 0 or more)", ErrConfig, c.LogRate)
	}
	if len(c.AllowedMethods) == 0 {
		return fmt.Errorf("%w: no allowed methods", ErrConfig)
	}
	for _, m := range c.AllowedMethods {
		if m == "" || strings.Trim(m, "ABCDEFGHIJKLMNOPQRSTUVWXYZ-_") != "" {
			return fmt.Errorf("%w: method %q (want upper-case letters)", ErrConfig, m)
		}
	}
	for _, ct := range c.AllowedContentTypes {
		if !validContentType(ct) {
			return fmt.Errorf("%w: content type %q (want type/subtype, lower case)", ErrConfig, ct)
		}
	}
	for _, r := range c.Exclusions {
		if err := r.valid(); err != nil {
			return err
		}
	}
	return nil
}

func validContentType(ct string) bool {
	t, sub, ok := strings.Cut(ct, "/")
	valid := func(s string) bool {
		return s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789.+-_") == ""
	}
	return ok && valid(t) && valid(sub)
}

// RuleRange is a rule id (From == To) or an inclusive range of ids.
type RuleRange struct{ From, To int }

func (r RuleRange) valid() error {
	if r.From < 1 || r.To > maxRuleID || r.From > r.To {
		return fmt.Errorf("%w: rule range %d-%d", ErrConfig, r.From, r.To)
	}
	return nil
}

// String is the SecRuleRemoveById form: "942100" or "942100-942199".
func (r RuleRange) String() string {
	if r.From == r.To {
		return strconv.Itoa(r.From)
	}
	return strconv.Itoa(r.From) + "-" + strconv.Itoa(r.To)
}

// MaxDirectivesFile bounds a directives file (ReadDirectivesFile): far
// more than any hand-written configuration, little memory.
const MaxDirectivesFile = 1 << 20

// ReadDirectivesFile reads a file of SecLang directives for
// SetupDirectives or ExtraDirectives: at most MaxDirectivesFile bytes of
// UTF-8. Its Include directives name files of the embedded rule set
// (@owasp_crs/…), not of the file system: the agent reads nothing else at
// run time.
func ReadDirectivesFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("%w: directives: %v", ErrConfig, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxDirectivesFile+1))
	if err != nil {
		return "", fmt.Errorf("%w: directives: %s: %v", ErrConfig, path, err)
	}
	if len(b) > MaxDirectivesFile {
		return "", fmt.Errorf("%w: directives: %s: larger than %d bytes", ErrConfig, path, MaxDirectivesFile)
	}
	if !utf8.Valid(b) {
		return "", fmt.Errorf("%w: directives: %s: not UTF-8", ErrConfig, path)
	}
	return string(b), nil
}

// maxExclusionLine bounds one line of an exclusion list.
const maxExclusionLine = 64 << 10

// ParseExclusions reads rule ids and ranges ("942100", "942100-942199")
// separated by commas or white space; "#" starts a comment that runs to
// the end of the line. Errors name the line.
func ParseExclusions(r io.Reader) ([]RuleRange, error) {
	var out []RuleRange
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxExclusionLine)
	for line := 1; sc.Scan(); line++ {
		text := sc.Bytes()
		if i := bytes.IndexByte(text, '#'); i >= 0 {
			text = text[:i]
		}
		for _, tok := range strings.FieldsFunc(string(text), func(c rune) bool {
			return c == ',' || c == ' ' || c == '\t' || c == '\r'
		}) {
			rr, err := parseRange(tok)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			out = append(out, rr)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: exclusions: %v", ErrConfig, err)
	}
	return out, nil
}

// ParseExclusionsFile is ParseExclusions on a file.
func ParseExclusionsFile(path string) ([]RuleRange, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: exclusions: %v", ErrConfig, err)
	}
	defer f.Close()
	rr, err := ParseExclusions(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rr, nil
}

func parseRange(tok string) (RuleRange, error) {
	from, to, isRange := strings.Cut(tok, "-")
	a, err := parseID(from)
	if err != nil {
		return RuleRange{}, err
	}
	b := a
	if isRange {
		if b, err = parseID(to); err != nil {
			return RuleRange{}, err
		}
	}
	rr := RuleRange{From: a, To: b}
	return rr, rr.valid()
}

func parseID(s string) (int, error) {
	// Digits only: strconv.Atoi would take "+1" and SecLang would not.
	if s == "" || len(s) > 8 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("%w: rule id %q", ErrConfig, s)
	}
	n, _ := strconv.Atoi(s)
	return n, nil
}
