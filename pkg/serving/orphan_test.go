package serving

import (
	"os/exec"
	"testing"
	"time"
)

// TestWaitGoneCountsZombies: a process that exited but was not reaped is
// gone for waitGone (its parent may be an init stuck on swap).
func TestWaitGoneCountsZombies(t *testing.T) {
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	if err := waitGone(cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
}
