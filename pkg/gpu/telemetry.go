// GPU telemetry through NVML, for the metrics.

package gpu

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Telemetry is a snapshot of one GPU's state, read through NVML.
type Telemetry struct {
	Name              string
	MemoryUsedBytes   uint64
	MemoryTotalBytes  uint64
	UtilizationGPU    uint32 // percent of time a kernel ran, last sample period
	UtilizationMemory uint32 // percent of time memory was read or written
	TemperatureC      uint32
	PCIeTxBytesPerSec uint64 // device to host
	PCIeRxBytesPerSec uint64 // host to device
}

// Monitor reads Telemetry of one GPU. It is safe for concurrent use.
type Monitor struct {
	mu  sync.Mutex
	dev nvml.Device
}

// OpenMonitor initializes NVML for the GPU with the given index. Without
// libnvidia-ml or the GPU it returns an error wrapping ErrUnavailable.
func OpenMonitor(index int) (*Monitor, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: nvml: %s", ErrUnavailable, nvml.ErrorString(ret))
	}
	dev, ret := nvml.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		nvml.Shutdown()
		return nil, fmt.Errorf("%w: nvml device %d: %s", ErrUnavailable, index, nvml.ErrorString(ret))
	}
	return &Monitor{dev: dev}, nil
}

// Snapshot reads the current figures. A figure the GPU does not report
// is left zero; only a failure to read the name or memory is an error.
func (m *Monitor) Snapshot() (Telemetry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var t Telemetry
	if m.dev == nil {
		return t, fmt.Errorf("%w: monitor closed", ErrUnavailable)
	}
	var ret nvml.Return
	if t.Name, ret = m.dev.GetName(); ret != nvml.SUCCESS {
		return t, fmt.Errorf("nvml: name: %s", nvml.ErrorString(ret))
	}
	mem, ret := m.dev.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return t, fmt.Errorf("nvml: memory: %s", nvml.ErrorString(ret))
	}
	t.MemoryUsedBytes, t.MemoryTotalBytes = mem.Used, mem.Total
	if u, ret := m.dev.GetUtilizationRates(); ret == nvml.SUCCESS {
		t.UtilizationGPU, t.UtilizationMemory = u.Gpu, u.Memory
	}
	if c, ret := m.dev.GetTemperature(nvml.TEMPERATURE_GPU); ret == nvml.SUCCESS {
		t.TemperatureC = c
	}
	// NVML reports PCIe throughput in KB/s over a 20ms sample.
	if v, ret := m.dev.GetPcieThroughput(nvml.PCIE_UTIL_TX_BYTES); ret == nvml.SUCCESS {
		t.PCIeTxBytesPerSec = uint64(v) * 1024
	}
	if v, ret := m.dev.GetPcieThroughput(nvml.PCIE_UTIL_RX_BYTES); ret == nvml.SUCCESS {
		t.PCIeRxBytesPerSec = uint64(v) * 1024
	}
	return t, nil
}

// Close shuts NVML down.
func (m *Monitor) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.dev == nil {
		return nil
	}
	m.dev = nil
	if ret := nvml.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml: shutdown: %s", nvml.ErrorString(ret))
	}
	return nil
}
