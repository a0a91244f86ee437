package serving

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testpki"
)

func TestLoopbackTCP(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:10809":     true,
		"127.9.9.9:10809":     true,
		"[::1]:10809":         true,
		"localhost:10809":     true,
		"LOCALHOST.:10809":    true,
		":10809":              true,
		"0.0.0.0:10809":       false,
		"[::]:10809":          false,
		"192.0.2.7:10809":     false,
		"[2001:db8::1]:10809": false,
		"gzramd.example:1":    false,
		"localhost.example:1": false,
		"no port":             false,
	} {
		if got := LoopbackTCP(addr); got != want {
			t.Errorf("LoopbackTCP(%q) = %v, want %v", addr, got, want)
		}
	}
}

// Credentials that do not load stop a fresh start, but not a serving
// process that took the device over: it leaves the TCP listener off, and
// says why.
func TestLoadTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testpki.NewCA("test CA")
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.Server("gzramd", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	cert, key, err := leaf.Write(dir, "cert.pem", "key.pem")
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	ls := &listeners{cfg: &Config{TCP: "0.0.0.0:10809"}, log: slog.New(slog.NewTextHandler(&logs, nil))}

	if conf, serve, err := ls.loadTLS(); conf != nil || !serve || err != nil {
		t.Errorf("without TLS: %v %v %v, want no TLS and the listener on", conf, serve, err)
	}
	ls.cfg.TLSCert, ls.cfg.TLSKey = cert, key
	if conf, serve, err := ls.loadTLS(); conf == nil || !serve || err != nil {
		t.Errorf("with TLS: %v %v %v, want TLS and the listener on", conf, serve, err)
	}

	if err := os.WriteFile(key, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, serve, err := ls.loadTLS(); serve || err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Errorf("a fresh start with a bad key: listener %v, %v; want off and an error naming the flags", serve, err)
	}
	ls.recovered = true
	if conf, serve, err := ls.loadTLS(); conf != nil || serve || err != nil {
		t.Errorf("a takeover with a bad key: %v %v %v, want the listener off and no error", conf, serve, err)
	}
	if !strings.Contains(logs.String(), "the TCP listener is off") || !strings.Contains(logs.String(), filepath.Base(key)) {
		t.Errorf("the takeover did not log why the TCP listener is off:\n%s", logs.String())
	}
}
