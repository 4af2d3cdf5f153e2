package dataplane_test

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/zentinelproxy/sidecar/internal/agentmux"
	"github.com/zentinelproxy/sidecar/internal/config"
)

// TestHTTP2ResponsesPerStream: each response carries its own fields and
// length, whether its stream's are those of the one before it on the
// connection or not (the front end reuses the strings a pooled stream
// sent last when they repeat), one stream at a time and many at once
// (their frames written together).
func TestHTTP2ResponsesPerStream(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("X-Seq", strconv.Itoa(n))
		w.Header().Set("X-Same", "same")
		w.Header().Set("Content-Type", "text/plain")
		if n%4 == 3 {
			// A field the others lack, before the common ones.
			w.Header().Set("A-Sometimes", "s"+strconv.Itoa(n))
		}
		_, _ = w.Write([]byte(strings.Repeat("x", n/2%5)))
	})
	cfg, err := config.Parse([]byte(fmt.Sprintf(`
listeners: [{address: "127.0.0.1:0", protocols: [h2c]}]
upstreams: [{name: app, address: %q}]
routes: [{upstream: app}]
`, up.addr())))
	if err != nil {
		t.Fatal(err)
	}
	p := startProxy(t, cfg, map[string]agentmux.Agent{}, nil)
	c := h2cClient()
	check := func(n int) error {
		req, err := http.NewRequest("GET", fmt.Sprintf("http://%s/r?n=%d", p.addr, n), nil)
		if err != nil {
			return err
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if err != nil {
			return fmt.Errorf("request %d: %w", n, err)
		}
		want := strings.Repeat("x", n/2%5)
		if string(body) != want {
			return fmt.Errorf("request %d: body %q, want %q", n, body, want)
		}
		got := []string{resp.Header.Get("X-Seq"), resp.Header.Get("X-Same"), resp.Header.Get("A-Sometimes"), strconv.FormatInt(resp.ContentLength, 10)}
		sometimes := ""
		if n%4 == 3 {
			sometimes = "s" + strconv.Itoa(n)
		}
		if w := []string{strconv.Itoa(n), "same", sometimes, strconv.Itoa(len(want))}; strings.Join(got, "|") != strings.Join(w, "|") {
			return fmt.Errorf("request %d: fields and length %q, want %q", n, got, w)
		}
		return nil
	}
	for n := range 40 {
		if err := check(n); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for n := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := check(1000 + n); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
