package metrics

import (
	"testing"
)

func TestKernelCollector(t *testing.T) {
	var st KernelState
	get := scraper(t, NewKernel(func() KernelState { return st }))

	// A plain export: no swap, no kernel device of its own.
	f, body := get()
	want(t, f, "gzramd_swap_active", 0)
	want(t, f, "gzramd_swap_expected", 0)
	if _, ok := f.Value("gzramd_kernel_device_attached"); ok {
		t.Error("gzramd_kernel_device_attached exported by a daemon that attaches no device")
	}
	promtoolCheck(t, body)

	// --swap, and the kernel dropped the device: the states are
	// independent, each read afresh at every scrape.
	st = KernelState{SwapActive: true, SwapExpected: true, Device: true}
	f, _ = get()
	want(t, f, "gzramd_swap_active", 1)
	want(t, f, "gzramd_swap_expected", 1)
	want(t, f, "gzramd_kernel_device_attached", 0)

	st.Attached, st.SwapActive = true, false
	f, _ = get()
	want(t, f, "gzramd_swap_active", 0)
	want(t, f, "gzramd_kernel_device_attached", 1)
}
