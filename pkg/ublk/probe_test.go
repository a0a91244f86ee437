package ublk

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestProbeNoDriver(t *testing.T) {
	err := Probe(filepath.Join(t.TempDir(), "ublk-control"))
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "modprobe ublk_drv") {
		t.Fatalf("Probe without a control device: %v, want ErrNoDriver saying modprobe ublk_drv", err)
	}
}

func TestProbeNoPermission(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root opens a file of mode 0 anyway")
	}
	path := filepath.Join(t.TempDir(), "ublk-control")
	if err := os.WriteFile(path, nil, 0); err != nil {
		t.Fatal(err)
	}
	err := Probe(path)
	if !errors.Is(err, os.ErrPermission) || !strings.Contains(err.Error(), "root") {
		t.Fatalf("Probe of a control device this user may not open: %v, want a permission error naming root", err)
	}
}

func TestAddDevError(t *testing.T) {
	for _, c := range []struct {
		err  error
		want string
	}{
		{unix.EINVAL, "Linux 6.5"},
		{unix.EPERM, "CAP_SYS_ADMIN"},
		{unix.ENODEV, "ADD_DEV"},
	} {
		err := addDevError(c.err, FlagUserCopy|FlagCmdIoctlEncode)
		if !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ADD_DEV failing with %v: %v, want it wrapped, saying %q", c.err, err, c.want)
		}
	}
}
