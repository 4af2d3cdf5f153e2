package agentcheck

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the report as one JSON document (for CI).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		*Report
		Summary map[Status]int `json:"summary"`
	}{r, r.Counts()})
}

// WriteTable writes the report as a readable table; the evidence of every
// result that is not PASS or SKIP follows the table.
func (r *Report) WriteTable(w io.Writer) error {
	var b strings.Builder
	agent := ""
	if r.Agent != "" {
		agent = fmt.Sprintf(" (agent %q)", r.Agent)
	}
	fmt.Fprintf(&b, "agent-check %s %s%s\n\n", r.Transport, r.Address, agent)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tTIME\tDETAIL")
	for _, x := range r.Results {
		d := x.Detail
		if len(d) > 160 && (x.Status == Pass || x.Status == Skip) {
			d = d[:157] + "..."
		}
		fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", x.ID, x.Status, x.Elapsed.Round(time.Millisecond), d)
	}
	_ = tw.Flush()
	for _, x := range r.Results {
		if x.Status == Pass || x.Status == Skip {
			continue
		}
		fmt.Fprintf(&b, "\n%s %s: %s\n  %s\n", x.Status, x.ID, x.Title, x.Detail)
		if x.Rule != "" {
			fmt.Fprintf(&b, "  rule: %s\n", x.Rule)
		}
		for _, s := range x.Sent {
			fmt.Fprintf(&b, "  sent:     %s\n", s)
		}
		for _, s := range x.Received {
			fmt.Fprintf(&b, "  received: %s\n", s)
		}
	}
	if s := r.Soak; s != nil && len(s.RSS) > 0 {
		fmt.Fprintf(&b, "\nRSS over the soak:")
		step := max(1, len(s.RSS)/12)
		for i := 0; i < len(s.RSS); i += step {
			fmt.Fprintf(&b, " %v=%.1fMiB", s.RSS[i].At.Round(100*time.Millisecond), mib(s.RSS[i].Bytes))
		}
		fmt.Fprintln(&b)
	}
	c := r.Counts()
	fmt.Fprintf(&b, "\n%d PASS, %d WARN, %d FAIL, %d SKIP\n", c[Pass], c[Warn], c[Fail], c[Skip])
	_, err := io.WriteString(w, b.String())
	return err
}
