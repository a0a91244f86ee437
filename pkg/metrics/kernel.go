// Whether the kernel uses the export as swap, and whether the kernel device
// the daemon attached is connected.

package metrics

import "github.com/prometheus/client_golang/prometheus"

// KernelState is what the daemon knows of the kernel's use of its export.
type KernelState struct {
	SwapActive   bool // the export backs active swap on this host
	SwapExpected bool // the daemon turns swap on itself (--swap)
	Device       bool // the daemon attaches the kernel device itself (--device, --swap)
	Attached     bool // that device is connected to the export
}

// Kernel exports KernelState, read at scrape time. It implements
// prometheus.Collector.
type Kernel struct {
	state                      func() KernelState
	active, expected, attached *prometheus.Desc
}

// NewKernel returns a collector over the states state returns.
func NewKernel(state func() KernelState) *Kernel {
	return &Kernel{
		state: state,
		active: gauge("gzramd_swap_active",
			"1 while the export backs active swap on this host (the SWAP column of gzramd status), else 0."),
		expected: gauge("gzramd_swap_expected",
			"1 when the daemon turns swap on itself (--swap), so gzramd_swap_active should be 1; 0 otherwise."),
		attached: gauge("gzramd_kernel_device_attached",
			"1 while the kernel device the daemon attached (--device, --swap) is connected to the export, else 0; absent without --device."),
	}
}

// Describe implements prometheus.Collector.
func (m *Kernel) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.active
	ch <- m.expected
	ch <- m.attached
}

// Collect implements prometheus.Collector. The attached gauge is left out
// when the daemon attaches no device, so that an alert on it being 0
// concerns only daemons meant to have one.
func (m *Kernel) Collect(ch chan<- prometheus.Metric) {
	s := m.state()
	g := func(d *prometheus.Desc, v bool) {
		f := 0.0
		if v {
			f = 1
		}
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, f)
	}
	g(m.active, s.SwapActive)
	g(m.expected, s.SwapExpected)
	if s.Device {
		g(m.attached, s.Attached)
	}
}
