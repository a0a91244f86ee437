package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The default socket: systemd's runtime directory for the unit, /run for
// root, and an ordinary user's own runtime directory, where /run/gzramd
// is not theirs to write, so that a first `gzramd serve` works.
func TestDefaultSocket(t *testing.T) {
	for _, c := range []struct {
		runtimeDir, xdg string
		mayWriteSystem  bool
		want            string
	}{
		{"/run/gzramd", "/run/user/1000", false, "/run/gzramd/gzramd.sock"},
		{"/run/a:/run/b", "", true, "/run/a/gzramd.sock"},
		{"", "/run/user/0", true, "/run/gzramd/gzramd.sock"},
		{"", "/run/user/1000", false, "/run/user/1000/gzramd/gzramd.sock"},
		{"", "", false, "/run/gzramd/gzramd.sock"}, // and socketDir says what to pass
	} {
		if got := socketFor(c.runtimeDir, c.xdg, c.mayWriteSystem); got != c.want {
			t.Errorf("socketFor(%q, %q, %v) = %q, want %q", c.runtimeDir, c.xdg, c.mayWriteSystem, got, c.want)
		}
	}
}

// Only the default socket's directory is created: a mistyped --socket
// fails in one line that names the directory, and leaves none behind.
func TestSocketDirCreatesOnlyTheDefault(t *testing.T) {
	tmp := t.TempDir()
	def := filepath.Join(tmp, "default", "gzramd.sock")
	if err := socketDir(def, def); err != nil {
		t.Fatalf("the default's directory: %v", err)
	}
	if fi, err := os.Stat(filepath.Dir(def)); err != nil || !fi.IsDir() {
		t.Errorf("the default's directory was not created: %v", err)
	}

	typo := filepath.Join(tmp, "nonexistent", "dir", "s.sock")
	_, stderr, code := gzramd(t, nil, "serve", "--socket", typo, "--metrics", "")
	want := "gzramd: invalid --socket " + typo + ": the directory " + filepath.Dir(typo) + " does not exist (gzramd creates only the default's"
	if code == 0 || !strings.HasPrefix(stderr, want) || strings.Count(strings.TrimSpace(stderr), "\n") != 0 {
		t.Errorf("serve --socket %s: status %d, stderr:\n%s\nwant the one line %q...", typo, code, stderr, want)
	}
	if _, err := os.Stat(filepath.Join(tmp, "nonexistent")); !os.IsNotExist(err) {
		t.Errorf("serve created a directory for a --socket that is not the default: %v", err)
	}
}

// A default socket whose directory cannot be made says, in one line,
// what to pass instead.
func TestSocketDirSaysWhatToPass(t *testing.T) {
	def := "/proc/gzramd-test/gzramd.sock" // not even root may make it
	err := socketDir(def, def)
	if err == nil || !strings.HasPrefix(err.Error(), "cannot create /proc/gzramd-test for the default --socket (") ||
		!strings.Contains(err.Error(), "pass --socket PATH") || strings.Contains(err.Error(), "\n") {
		t.Errorf("socketDir of an impossible default: %v", err)
	}
}
