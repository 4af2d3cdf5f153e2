package corazawaf

import (
	"testing"
	"time"

	coreruleset "github.com/corazawaf/coraza-coreruleset/v4"
	coraza "github.com/corazawaf/coraza/v3"
)

// reportCPU reports the CPU time per iteration since start as cpu-ns/op
// (where cpuTime measures it).
func reportCPU(b *testing.B, start time.Duration) {
	if b.N > 0 && start > 0 {
		b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkLibraryFloor is Coraza with the stock CRS setup and no agent,
// the floor under BenchmarkDecision/get: WAF.NewTransaction, ProcessURI,
// the same three headers, ProcessRequestHeaders (CRS phase 1) and Close;
// then also ProcessRequestBody (phase 2, where CRS checks the query
// string's arguments); then the whole cycle the agent runs (response
// headers, phases 3 to 5). With the @rx pre-filter off and on.
func BenchmarkLibraryFloor(b *testing.B) {
	hdrs := [][2]string{{"host", "app.example"}, {"user-agent", "curl/8.5.0"}, {"accept", "*/*"}}
	const uri = "/search?q=blue+running+shoes&page=2"
	for _, prefilter := range []string{"Off", "On"} {
		waf, err := coraza.NewWAF(coraza.NewWAFConfig().WithRootFS(coreruleset.FS).WithDirectives(`Include @coraza.conf-recommended
SecRuleEngine On
SecResponseBodyAccess Off
SecAuditEngine Off
SecRxPreFilter ` + prefilter + `
Include @crs-setup.conf.example
Include @owasp_crs/*.conf
`))
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name  string
			phase int
		}{{"get-phase1", 1}, {"get-phase2", 2}, {"get-all-phases", 5}} {
			b.Run("prefilter="+prefilter+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				cpu := cpuTime()
				for b.Loop() {
					tx := waf.NewTransaction()
					tx.ProcessConnection("10.0.0.7", 40000, "", 0)
					tx.ProcessURI(uri, "GET", "HTTP/1.1")
					for _, h := range hdrs {
						tx.AddRequestHeader(h[0], h[1])
					}
					if it := tx.ProcessRequestHeaders(); it != nil {
						b.Fatal(it)
					}
					if c.phase >= 2 {
						if it, _ := tx.ProcessRequestBody(); it != nil {
							b.Fatal(it)
						}
					}
					if c.phase >= 5 {
						tx.AddResponseHeader("content-type", "application/json")
						if it := tx.ProcessResponseHeaders(200, "HTTP/1.1"); it != nil {
							b.Fatal(it)
						}
						if it, _ := tx.ProcessResponseBody(); it != nil {
							b.Fatal(it)
						}
						tx.ProcessLogging()
					}
					_ = tx.Close()
				}
				reportCPU(b, cpu)
			})
		}
	}
}
