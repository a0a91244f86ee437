package main

import (
	"bytes"
	"syscall"
	"testing"
	"time"
)

// The survive scenario's mutant (GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER, a
// faults build) loses exactly one stored page when a serving process takes
// the device over from one that died, and none without a takeover: the
// scenario must fail with it, so that its pass means something.
func TestLosePageOnTakeoverMutant(t *testing.T) {
	d := startDaemon(t, []string{"GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER=1"}, append(hardeningOff, "--size", "16MiB", "--backend", "cpu")...)
	c := dialRaw(t, d.socket)
	const pages = 256
	data := writePages(t, c, pages, 512, 32, 11)
	checkPages(t, c, data, "before any takeover")
	if err := syscall.Kill(d.servingPID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.waitLog(`took the device over from a serving process that died`, 20*time.Second)
	d.waitLog(`(?s)msg="serving NBD".*msg="serving NBD"`, 20*time.Second) // the next process listens
	c = dialRaw(t, d.socket)
	lost := 0
	for i := range pages {
		got, errno, err := c.Read(uint64(i)*4096, 4096)
		if err != nil || errno != 0 {
			t.Fatalf("read page %d: %v, errno %d", i, err, errno)
		}
		if !bytes.Equal(got, data[i*4096:(i+1)*4096]) {
			lost++
		}
	}
	if lost != 1 {
		t.Errorf("%d pages differ after the takeover, want the mutant's 1", lost)
	}
	// Lost for good, not only in the one reply.
	checked := 0
	for i := range pages {
		got, _, err := c.Read(uint64(i)*4096, 4096)
		if err == nil && !bytes.Equal(got, data[i*4096:(i+1)*4096]) {
			checked++
		}
	}
	if checked != 1 {
		t.Errorf("%d pages differ when read again, want the lost one", checked)
	}
	d.waitLog(`fault: lost a page after the takeover`, time.Second)
}
