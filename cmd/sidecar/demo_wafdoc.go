package main

import (
	"text/template"

	"github.com/zentinelproxy/sidecar/sdk"
)

// demoWAF is the agent of `sidecar demo -agent waf` (demo_waf.go; a
// build with the nowaf tag leaves Coraza out of the binary).
type demoWAF interface {
	sdk.Handler
	// Close closes the transactions still open.
	Close() error
}

var wafInstructions = template.Must(template.New("").Parse(`
The sidecar demo is running with the WAF agent (Coraza + OWASP Core Rule Set v4,
paranoia level 1, blocking):

  curl ──▶ sidecar http://{{.Sidecar}} ──▶ upstream http://{{.Upstream}}
                   │
                   └─ agent "waf" over {{.Transport}} ({{.Agent}})

Try (in another terminal):

  # Allowed: the upstream echoes the request it got.
  curl -s 'http://{{.Sidecar}}/products?id=42'

  # SQL injection in the query string: 403, and the CRS rule id (942100)
  # in the x-waf-rule-id header and the JSON body. The upstream never sees it.
  curl -i "http://{{.Sidecar}}/products?id=1'%20OR%20'1'='1"

  # Cross-site scripting in a form body (inspected with the headers).
  curl -i http://{{.Sidecar}}/comment --data-urlencode 'text=<script>alert(1)</script>'

  # A scanner's User-Agent (rule 913100).
  curl -i -A 'sqlmap/1.7' http://{{.Sidecar}}/

The agent logs each match (rule ids, anomaly score) at most 10 lines a second.
Press Ctrl-C to stop.
`))
