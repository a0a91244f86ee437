package serving

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// TestStatusAttr: the "gzramd ready" line names the status command only
// where `gzramd status` alone would not find the daemon.
func TestStatusAttr(t *testing.T) {
	for metrics, want := range map[string]string{
		"127.0.0.1:9829": "",
		"":               "",
		"127.0.0.1:0":    "",
		":9829":          "",
		"0.0.0.0:9829":   "",
		"[::]:9829":      "",
		"127.0.0.1:9830": ` status="gzramd status --metrics 127.0.0.1:9830"`,
		"localhost:9829": ` status="gzramd status --metrics localhost:9829"`,
		"[::1]:9900":     ` status="gzramd status --metrics [::1]:9900"`,
		":9900":          ` status="gzramd status --metrics 127.0.0.1:9900"`,
		"192.0.2.1:9829": ` status="gzramd status --metrics 192.0.2.1:9829"`,
		"not an address": "",
	} {
		var b bytes.Buffer
		log := slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey || a.Key == slog.LevelKey {
					return slog.Attr{}
				}
				return a
			},
		}))
		log.Info("gzramd ready", "size", "1GiB", statusAttr(metrics))
		if got := strings.TrimPrefix(strings.TrimSpace(b.String()), `msg="gzramd ready" size=1GiB`); got != want {
			t.Errorf("--metrics %q: the ready line ends %q, want %q", metrics, got, want)
		}
	}
}
