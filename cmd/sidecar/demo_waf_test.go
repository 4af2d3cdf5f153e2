//go:build !nowaf

package main

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestDemoWAF(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	readyc := make(chan demoAddrs, 1)
	done := make(chan error, 1)
	var printed bytes.Buffer
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	go func() {
		done <- runDemo(ctx, demoOptions{Listen: "127.0.0.1:0", Agent: "waf", Log: log, LogLevel: "warn"},
			func(a demoAddrs) { printInstructions(&printed, a); readyc <- a })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("demo returned %v after cancel", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("demo did not stop")
		}
	})
	var a demoAddrs
	select {
	case a = <-readyc:
	case err := <-done:
		t.Fatalf("demo failed to start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("demo not ready")
	}
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
