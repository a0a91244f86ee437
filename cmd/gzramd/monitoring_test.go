package main

import (
	"os"
	"testing"
	"time"
)

// TestSwapMetrics checks that gzramd_swap_active follows the detection
// `gzramd status` uses, on a stand-in kernel whose /dev/nbd7 is swap set
// up by this test's connection.
func TestSwapMetrics(t *testing.T) {
	env, swaps := fakeKernel(t, os.Getpid())
	d := startDaemon(t, env, append(hardeningOff, "--backend", "cpu")...)
	want := func(name string, v float64) {
		t.Helper()
		if got, ok := d.scrape().Value(name); !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, v)
		}
	}
	want("gzramd_swap_active", 0) // nothing connected yet: nbd7 is someone else's
	want("gzramd_swap_expected", 0)
	if _, ok := d.scrape().Value("gzramd_kernel_device_attached"); ok {
		t.Error("gzramd_kernel_device_attached exported without --device")
	}

	dialRaw(t, d.socket)
	time.Sleep(100 * time.Millisecond)
	want("gzramd_swap_active", 1)
	writeSwaps(t, swaps, false) // swapoff
	want("gzramd_swap_active", 0)
}
