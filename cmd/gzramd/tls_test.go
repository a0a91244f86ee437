package main

import (
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/internal/testpki"
	"github.com/gzramd/gzramd/pkg/pipeline"
	"github.com/gzramd/gzramd/pkg/serving"
)

// tlsFiles writes a CA, a server certificate for loopback and a second
// key, and returns their paths.
type tlsFiles struct {
	ca         *testpki.CA
	caFile     string
	cert, key  string
	otherKey   string
	clientDir  string // GnuTLS's layout, with a client certificate
	clientName string
}

func newTLSFiles(t *testing.T) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	ca, err := testpki.NewCA("gzramd test CA")
	if err != nil {
		t.Fatal(err)
	}
	f := tlsFiles{ca: ca, caFile: filepath.Join(dir, "ca.pem"), clientDir: t.TempDir(), clientName: "host-b"}
	if err := testpki.WriteFile(f.caFile, ca.PEM); err != nil {
		t.Fatal(err)
	}
	server, err := ca.Server("gzramd", "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	if f.cert, f.key, err = server.Write(dir, "cert.pem", "key.pem"); err != nil {
		t.Fatal(err)
	}
	other, err := ca.Server("other", "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	if _, f.otherKey, err = other.Write(dir, "other-cert.pem", "other-key.pem"); err != nil {
		t.Fatal(err)
	}
	client, err := ca.Client(f.clientName)
	if err != nil {
		t.Fatal(err)
	}
	if err := testpki.ClientDir(f.clientDir, ca, &client); err != nil {
		t.Fatal(err)
	}
	return f
}

// --tcp beyond loopback is refused without TLS or --tcp-insecure, with an
// error that names the flags that fix it; the TLS flags are checked
// together, and the files at start.
func TestTCPNeedsTLSBeyondLoopback(t *testing.T) {
	f := newTLSFiles(t)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	for _, tc := range []struct {
		args []string
		err  []string // empty: valid
	}{
		{[]string{"--tcp", "0.0.0.0:10809"}, []string{"refusing --tcp 0.0.0.0:10809", "--tls-cert", "--tls-key", "--tcp-insecure"}},
		{[]string{"--tcp", "[::]:10809"}, []string{"refusing --tcp", "--tcp-insecure"}},
		{[]string{"--tcp", "192.0.2.1:10809"}, []string{"refusing --tcp", "--tcp-insecure"}},
		{[]string{"--tcp", "gzramd.example:10809"}, []string{"refusing --tcp", "--tcp-insecure"}},
		{[]string{"--tcp", "127.0.0.1:10809"}, nil},
		{[]string{"--tcp", "127.3.2.1:10809"}, nil},
		{[]string{"--tcp", "[::1]:10809"}, nil},
		{[]string{"--tcp", "localhost:10809"}, nil},
		{[]string{"--tcp", ":10809"}, nil},
		{[]string{"--tcp", "0.0.0.0:10809", "--tcp-insecure"}, nil},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert, "--tls-key", f.key}, nil},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert, "--tls-key", f.key, "--tls-ca", f.caFile}, nil},
		{[]string{"--tcp", "127.0.0.1:10809", "--tls-cert", f.cert, "--tls-key", f.key}, nil},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert}, []string{"--tls-cert and --tls-key go together"}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-key", f.key}, []string{"--tls-cert and --tls-key go together"}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-ca", f.caFile, "--tcp-insecure"}, []string{"--tls-ca needs --tls-cert"}},
		{[]string{"--tls-cert", f.cert, "--tls-key", f.key}, []string{"secure --tcp, which is not given"}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert, "--tls-key", f.key, "--tcp-insecure"}, []string{"--tcp-insecure contradicts --tls-cert"}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", missing, "--tls-key", f.key}, []string{"invalid --tls-cert", missing, "no such file"}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert, "--tls-key", f.otherKey}, []string{"invalid --tls-cert", f.cert, f.otherKey, "does not match"}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert, "--tls-key", f.key, "--tls-ca", f.key}, []string{"invalid --tls-cert", "CA bundle", f.key}},
		{[]string{"--tcp", "0.0.0.0:10809", "--tls-cert", f.cert, "--tls-key", f.key, "--socket", "", "--swap"}, []string{"--socket PATH"}},
	} {
		cfg := &serving.Config{Size: 1 << 30, GoMemoryLimit: 512 << 20, Prefault: 16 << 20, Staging: pipeline.DefaultStagingBytes}
		cmd := serveCmd(cfg)
		if err := cmd.ParseFlags(tc.args); err != nil {
			t.Fatal(err)
		}
		err := validate(cfg)
		switch {
		case len(tc.err) == 0 && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case len(tc.err) > 0 && err == nil:
			t.Errorf("%q: accepted, want an error", tc.args)
		case err != nil:
			for _, w := range tc.err {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q: %v; want it to say %q", tc.args, err, w)
				}
			}
		}
	}
}

// gzramd serve with TLS on --tcp and client certificates required: a
// libnbd client with a certificate gets in over nbds://, and the log
// names it; the Unix socket stays plain.
func TestServeTLS(t *testing.T) {
	testneeds.Command(t, "nbdinfo", "libnbd-bin")
	f := newTLSFiles(t)
	d := startDaemon(t, nil, append(hardeningOff, "--size", "64MiB", "--backend", "cpu",
		"--tcp", "127.0.0.1:0", "--tls-cert", f.cert, "--tls-key", f.key, "--tls-ca", f.caFile)...)
	m := regexp.MustCompile(`msg="serving NBD" addr=(127\.0\.0\.1:[0-9]+) network=tcp export=gzram0 tls=true`).FindStringSubmatch(d.log.String())
	if m == nil {
		t.Fatalf("no TLS listener in the log:\n%s", d.log.String())
	}
	out := runClient(t, nil, "nbdinfo", "--size", "nbds://"+m[1]+"/gzram0?tls-certificates="+f.clientDir)
	if strings.TrimSpace(out) != "67108864" {
		t.Errorf("nbdinfo over TLS: %q", out)
	}
	runClient(t, nil, "nbdinfo", "--size", d.uri())
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(d.log.String(), `msg="nbd: TLS client disconnected"`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, want := range []string{`msg="nbd: TLS client connected"`, `msg="nbd: TLS client disconnected"`} {
		if !regexp.MustCompile(regexp.QuoteMeta(want) + ` remote=127\.0\.0\.1:[0-9]+ client=` + f.clientName).MatchString(d.log.String()) {
			t.Errorf("no line %s naming the client %s", want, f.clientName)
		}
	}
}
