package nbd

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/internal/testpki"
)

// These tests drive a TLS-only listener with real clients (libnbd-bin,
// qemu-utils, which use GnuTLS), with client certificates required.

// mutualTLSServer starts a TLS-only server that requires client
// certificates, and returns it with a directory of client credentials in
// GnuTLS's layout (ca-cert.pem, client-cert.pem, client-key.pem) and one
// with the CA alone.
func mutualTLSServer(t *testing.T) (s *tlsServer, withCert, withoutCert string) {
	t.Helper()
	p := newPKI(t)
	p.files.CA = filepath.Join(p.dir, "ca.pem")
	s = startTLSServer(t, p.files, Options{})
	client, err := p.ca.Client("qemu-host")
	if err != nil {
		t.Fatal(err)
	}
	withCert, withoutCert = t.TempDir(), t.TempDir()
	if err := testpki.ClientDir(withCert, p.ca, &client); err != nil {
		t.Fatal(err)
	}
	if err := testpki.ClientDir(withoutCert, p.ca, nil); err != nil {
		t.Fatal(err)
	}
	return s, withCert, withoutCert
}

// nbdsURI is libnbd's URI of export d on s over TLS, with the credentials
// in dir.
func (s *tlsServer) nbdsURI(dir string) string {
	return "nbds://" + s.addr + "/d?tls-certificates=" + dir
}

func TestTLSNbdinfo(t *testing.T) {
	testneeds.Command(t, "nbdinfo", "libnbd-bin")
	s, withCert, withoutCert := mutualTLSServer(t)

	var info struct {
		Protocol string `json:"protocol"`
		TLS      bool   `json:"TLS"`
		Exports  []struct {
			Name string `json:"export-name"`
			Size int64  `json:"export-size"`
		} `json:"exports"`
	}
	out := runTool(t, "nbdinfo", "--json", s.nbdsURI(withCert))
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("nbdinfo output: %v\n%s", err, out)
	}
	if !info.TLS || len(info.Exports) != 1 || info.Exports[0].Size != 8<<20 {
		t.Errorf("nbdinfo over TLS: %s", out)
	}
	if n := s.logs.count("client=qemu-host"); n < 1 {
		t.Error("the client's certificate subject is not in the log")
	}

	// No client certificate; a plain nbd:// URI.
	for _, uri := range []string{s.nbdsURI(withoutCert), "nbd://" + s.addr + "/d"} {
		if out, err := exec.Command("nbdinfo", uri).CombinedOutput(); err == nil {
			t.Errorf("nbdinfo %s got in:\n%s", uri, out)
		}
	}
}

func TestTLSNbdcopy(t *testing.T) {
	testneeds.Command(t, "nbdcopy", "libnbd-bin")
	s, withCert, _ := mutualTLSServer(t)
	size := 8 << 20
	src := make([]byte, size)
	rand.Read(src[:size/2])
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in"), filepath.Join(dir, "out")
	if err := os.WriteFile(in, src, 0o600); err != nil {
		t.Fatal(err)
	}
	runTool(t, "nbdcopy", "--connections=4", "--requests=32", in, s.nbdsURI(withCert))
	if !bytes.Equal(s.mem.Snapshot(), src) {
		t.Fatal("backend differs from the source after nbdcopy over TLS")
	}
	runTool(t, "nbdcopy", "--connections=4", s.nbdsURI(withCert), out)
	got, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, src) {
		t.Fatal("nbdcopy over TLS read back other data")
	}
}

func TestTLSQemuImg(t *testing.T) {
	testneeds.Command(t, "qemu-img", "qemu-utils")
	testneeds.Command(t, "qemu-io", "qemu-utils")
	s, withCert, withoutCert := mutualTLSServer(t)
	host, port, _ := net.SplitHostPort(s.addr)
	creds := func(dir string) string {
		return "tls-creds-x509,id=tls0,dir=" + dir + ",endpoint=client"
	}
	image := fmt.Sprintf("driver=nbd,host=%s,port=%s,export=d,tls-creds=tls0", host, port)

	out := runTool(t, "qemu-img", "info", "--output=json", "--object", creds(withCert), "--image-opts", image)
	var info struct {
		Size int64 `json:"virtual-size"`
	}
	if err := json.Unmarshal([]byte(out), &info); err != nil || info.Size != 8<<20 {
		t.Fatalf("qemu-img info over TLS: %v\n%s", err, out)
	}
	out = runTool(t, "qemu-io", "--object", creds(withCert), "--image-opts", image,
		"-c", "write -P 0xa5 64k 128k", "-c", "read -P 0xa5 64k 128k", "-c", "flush")
	if strings.Contains(out, "failed") {
		t.Fatalf("qemu-io over TLS: %s", out)
	}
	if d := s.mem.Snapshot(); !bytes.Equal(d[64<<10:192<<10], bytes.Repeat([]byte{0xa5}, 128<<10)) {
		t.Error("qemu-io's write over TLS is not in the backend")
	}

	// Without a client certificate, and without TLS.
	cmd := exec.Command("qemu-img", "info", "--object", creds(withoutCert), "--image-opts", image)
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Errorf("qemu-img without a client certificate got in:\n%s", out)
	}
	cmd = exec.Command("qemu-img", "info", "--image-opts", fmt.Sprintf("driver=nbd,host=%s,port=%s,export=d", host, port))
	if out, err := cmd.CombinedOutput(); err == nil || !strings.Contains(string(out), "TLS") {
		t.Errorf("qemu-img without TLS: %v, want a refusal that says TLS:\n%s", err, out)
	}
}
