package job

import "testing"

func TestDenied(t *testing.T) {
	for target, want := range map[string]bool{
		"/admin": true, "/admin/": true, "/admin/x": true, "/admin?a=1": true,
		"/": false, "/adminx": false, "/index": false, "/x/admin": false, "": false,
	} {
		if got := Denied([]byte(target)); got != want {
			t.Errorf("Denied(%q) = %v, want %v", target, got, want)
		}
	}
}
