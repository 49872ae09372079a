package ratecord

import "testing"

func TestAPIPrefix(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v10/users/@me": "/api/v10",
		"/api/V9/gateway":    "/api/V9",
		"/api/users/@me":     "/api",
		"/users/@me":         "/api/v10",
	} {
		if got := apiPrefix(path); got != want {
			t.Errorf("apiPrefix(%q) = %q; want %q", path, got, want)
		}
	}
}
