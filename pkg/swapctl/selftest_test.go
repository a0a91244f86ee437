package swapctl

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// TestSelfTestOnALoopDevice runs the self-test on a real block device (a
// loop device over a file): it writes, reads back, compares and discards.
func TestSelfTestOnALoopDevice(t *testing.T) {
	testneeds.Root(t, "setting up a loop device")
	losetup := testneeds.Command(t, "losetup", "mount")
	backing := filepath.Join(t.TempDir(), "disk")
	if err := os.WriteFile(backing, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(backing, 2*SelfTestBytes); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(losetup, "--find", "--show", backing).Output()
	if err != nil {
		testneeds.Machine(t, "a free loop device, which losetup could not set up here (modprobe loop; containers seldom have one): %v", err)
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
