package procmem

import (
	"os"
	"os/exec"
	"slices"
	"testing"

	"github.com/gzramd/gzramd/internal/testneeds"
)

func TestReadSelf(t *testing.T) {
	u, err := Read(os.Getpid())
	if err != nil {
		testneeds.Machine(t, "/proc/PID/smaps_rollup (Linux 4.14 and later): %v", err)
	}
	if u.RSS <= 0 || u.PSS <= 0 || u.PSS > u.RSS || u.Anon <= 0 || u.Anon > u.RSS {
		t.Fatalf("implausible usage of this process: %+v", u)
	}
	// A buffer written whole is resident and anonymous.
	buf := make([]byte, 32<<20)
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 1
	}
	v, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if grew := v.Anon - u.Anon; grew < 30<<20 {
		t.Errorf("anonymous memory grew by %d bytes after writing 32 MiB", grew)
	}
	_ = buf[len(buf)-1]
}

func TestChildren(t *testing.T) {
	cmd := exec.Command(testneeds.Command(t, "sleep", "coreutils"), "10")
	if err := cmd.Start(); err != nil {
		testneeds.Machine(t, "a child process to start: %v", err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	kids, err := Children(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(kids, cmd.Process.Pid) {
		t.Errorf("Children(%d) = %v, want it to hold %d", os.Getpid(), kids, cmd.Process.Pid)
	}
	if p, err := Parent(cmd.Process.Pid); err != nil || p != os.Getpid() {
		t.Errorf("Parent(%d) = %d, %v; want %d", cmd.Process.Pid, p, err, os.Getpid())
	}
}

func TestReadMissing(t *testing.T) {
	if _, err := Read(1 << 30); err == nil {
		t.Error("Read of a pid that cannot exist succeeded")
	}
}
