package swapctl

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestSelfTestOnALoopDevice runs the self-test on a real block device (a
// loop device over a file): it writes, reads back, compares and discards.
func TestSelfTestOnALoopDevice(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("not root: a loop device needs root")
	}
	losetup, err := exec.LookPath("losetup")
	if err != nil {
		t.Skip("losetup not found (Debian package mount: apt-get install mount)")
	}
	backing := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, 2*SelfTestBytes); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "--find", "--show", backing).Output()
	if err != nil {
		t.Skipf("no loop device to be had here: %v", err)
	}
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() { exec.Command(losetup, "--detach", dev).Run() })
	if err := SelfTest(context.Background(), dev, 2*SelfTestBytes, 4); err != nil {
		t.Fatalf("self-test of %s: %v", dev, err)
	}
}

// TestSelfTestRefusesAFile: the self-test discards what it wrote, which
// only a block device can, and it says so rather than pass.
func TestSelfTestRefusesAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, SelfTestBytes); err != nil {
		t.Fatal(err)
	}
	if err := SelfTest(context.Background(), path, SelfTestBytes, 2); err == nil {
		t.Fatal("the self-test of a regular file passed")
	}
}
