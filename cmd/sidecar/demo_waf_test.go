//go:build !nowaf

package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestDemoWAF(t *testing.T) {
	var printed bytes.Buffer
	a := startDemoWith(t, demoOptions{Agent: "waf"}, func(a demoAddrs) { printInstructions(&printed, a) })
	base := "http://" + a.Sidecar
	if !strings.Contains(printed.String(), `curl -i "`+base+`/products?id=1'%20OR%20'1'='1"`) {
		t.Errorf("instructions lack the SQL injection curl:\n%s", printed.String())
	}

	// The curl the instructions print, as curl sends it.
	resp, body := get(t, base+"/products?id=1'%20OR%20'1'='1")
	if resp.StatusCode != 403 || resp.Header.Get("X-Waf-Rule-Id") != "942100" || !strings.Contains(body, `"rule_id":942100`) {
		t.Fatalf("sqli: %d %v %s", resp.StatusCode, resp.Header, body)
	}
	resp, body = get(t, base+"/products?id=42")
	if resp.StatusCode != 200 || !strings.Contains(body, `"uri": "/products?id=42"`) {
		t.Fatalf("benign: %d %s", resp.StatusCode, body)
	}
	// A form body is inspected (buffered, inline with the headers).
	r, err := http.Post(base+"/comment", "application/x-www-form-urlencoded",
		strings.NewReader("text=%3Cscript%3Ealert(1)%3C%2Fscript%3E"))
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != 403 || !strings.HasPrefix(r.Header.Get("X-Waf-Rule-Id"), "941") {
		t.Fatalf("xss body: %d %v", r.StatusCode, r.Header)
	}
}

func TestDemoUnknownAgent(t *testing.T) {
	err := runDemo(context.Background(), demoOptions{Listen: "127.0.0.1:0", Agent: "nginx"}, nil)
	if !errors.Is(err, errDemoAgent) {
		t.Fatalf("err %v, want errDemoAgent", err)
	}
}
