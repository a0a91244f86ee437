// The GPU's batch counters and NVML telemetry.

package metrics

import (
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// GPUCounters are the router's counters of the GPU's batches (pkg/route
// Stats).
type GPUCounters struct {
	Batches   uint64 // batches the GPU compressed
	Fallbacks uint64 // batches the GPU failed or overran, redone on the CPU
	Timeouts  uint64 // of Fallbacks: watchdog deadlines
	Skipped   uint64 // batches sent to the CPU while the GPU backed off, or held every shadow output
	Small     uint64 // batches too small for the GPU, sent to the CPU
}

// GPUTelemetry is one NVML reading (pkg/gpu Telemetry).
type GPUTelemetry struct {
	Name                                 string
	MemoryUsedBytes, MemoryTotalBytes    uint64
	UtilizationGPU, UtilizationMemory    uint32 // percent
	TemperatureC                         uint32
	PCIeTxBytesPerSec, PCIeRxBytesPerSec uint64
}

// GPU exports the GPU backend's fallbacks and, when NVML answers, the
// device's telemetry. It implements prometheus.Collector.
type GPU struct {
	index     string
	counters  func() GPUCounters
	telemetry func() (GPUTelemetry, error) // nil without NVML
	log       *slog.Logger

	mu      sync.Mutex
	lastErr time.Time // rate-limits telemetry error logs

	batches, small, fallbacks, timeouts, skipped           *prometheus.Desc
	memUsed, memTotal, util, memUtil, temp, pcieTx, pcieRx *prometheus.Desc
}

// ErrNoTelemetry is what a telemetry function returns while there is none
// (NVML not open yet, or not on this machine): the scrape leaves it out,
// and logs nothing.
var ErrNoTelemetry = errors.New("metrics: no GPU telemetry")

// NewGPU returns a collector for the GPU with the given index; telemetry
// may be nil, and errors it returns drop the telemetry from that scrape.
func NewGPU(index int, counters func() GPUCounters, telemetry func() (GPUTelemetry, error), log *slog.Logger) *GPU {
	l := []string{"gpu"}
	tl := []string{"gpu", "name"}
	return &GPU{
		index: strconv.Itoa(index), counters: counters, telemetry: telemetry, log: log,
		batches:   prometheus.NewDesc("gzramd_gpu_batches_total", "Batches the GPU compressed.", l, nil),
		small:     prometheus.NewDesc("gzramd_gpu_small_batches_total", "Staged batches too small to be worth the GPU (--gpu-min-pages), compressed on the CPU.", l, nil),
		fallbacks: prometheus.NewDesc("gzramd_gpu_fallbacks_total", "Batches the GPU failed or did not finish in time, compressed again on the CPU.", l, nil),
		timeouts:  prometheus.NewDesc("gzramd_gpu_timeouts_total", "GPU fallbacks caused by the per-batch watchdog deadline.", l, nil),
		skipped:   prometheus.NewDesc("gzramd_gpu_skipped_batches_total", "Batches sent to the CPU while the GPU backed off after failures, or held every shadow output (hung past the watchdog).", l, nil),
		memUsed:   prometheus.NewDesc("gzramd_gpu_memory_used_bytes", "GPU memory in use, all processes (NVML).", tl, nil),
		memTotal:  prometheus.NewDesc("gzramd_gpu_memory_total_bytes", "GPU memory (NVML).", tl, nil),
		util:      prometheus.NewDesc("gzramd_gpu_utilization_ratio", "Fraction of the last sample period a kernel ran on the GPU (NVML).", tl, nil),
		memUtil:   prometheus.NewDesc("gzramd_gpu_memory_utilization_ratio", "Fraction of the last sample period GPU memory was read or written (NVML).", tl, nil),
		temp:      prometheus.NewDesc("gzramd_gpu_temperature_celsius", "GPU temperature (NVML).", tl, nil),
		pcieTx:    prometheus.NewDesc("gzramd_gpu_pcie_tx_bytes_per_second", "PCIe throughput from the GPU to the host (NVML, 20ms sample).", tl, nil),
		pcieRx:    prometheus.NewDesc("gzramd_gpu_pcie_rx_bytes_per_second", "PCIe throughput from the host to the GPU (NVML, 20ms sample).", tl, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *GPU) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		m.batches, m.small, m.fallbacks, m.timeouts, m.skipped,
		m.memUsed, m.memTotal, m.util, m.memUtil, m.temp, m.pcieTx, m.pcieRx,
	} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *GPU) Collect(ch chan<- prometheus.Metric) {
	c := m.counters()
	for _, x := range []struct {
		d *prometheus.Desc
		v uint64
	}{{m.batches, c.Batches}, {m.small, c.Small}, {m.fallbacks, c.Fallbacks}, {m.timeouts, c.Timeouts}, {m.skipped, c.Skipped}} {
		ch <- prometheus.MustNewConstMetric(x.d, prometheus.CounterValue, float64(x.v), m.index)
	}
	if m.telemetry == nil {
		return
	}
	t, err := m.telemetry()
	if errors.Is(err, ErrNoTelemetry) {
		return
	}
	if err != nil {
		m.mu.Lock()
		if m.log != nil && time.Since(m.lastErr) > time.Minute {
			m.lastErr = time.Now()
			m.log.Warn("gpu telemetry unavailable for this scrape", "err", err)
		}
		m.mu.Unlock()
		return
	}
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, m.index, t.Name)
	}
	g(m.memUsed, float64(t.MemoryUsedBytes))
	g(m.memTotal, float64(t.MemoryTotalBytes))
	g(m.util, float64(t.UtilizationGPU)/100)
	g(m.memUtil, float64(t.UtilizationMemory)/100)
	g(m.temp, float64(t.TemperatureC))
	g(m.pcieTx, float64(t.PCIeTxBytesPerSec))
	g(m.pcieRx, float64(t.PCIeRxBytesPerSec))
}
