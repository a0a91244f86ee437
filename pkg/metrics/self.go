// gzramd's own memory, by process, and what the device saves net of it.

package metrics

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
)

// ProcessMemory is one of gzramd's processes and its memory, in bytes
// (procmem.Usage).
type ProcessMemory struct {
	Role   string `json:"role"` // supervisor, serving or standby
	PID    int    `json:"pid"`
	RSS    int64  `json:"rss_bytes"`
	PSS    int64  `json:"pss_bytes"`
	Anon   int64  `json:"anon_bytes"`
	Locked int64  `json:"locked_bytes"`
	Pinned int64  `json:"pinned_bytes"`
}

// SelfMemory is gzramd's processes and the device's figures the net
// saving is made of.
type SelfMemory struct {
	Processes []ProcessMemory
	// Saved is what the stored pages would take uncompressed
	// (orig_data_size, plus 4 KiB a same-filled page) and MemUsed the
	// store's memory in use (mem_used_total).
	Saved, MemUsed int64
}

// Own is gzramd's own memory: its processes' proportional sets (each
// shared page once) less the store's memory in use, which is what holds
// the pages (the store's prefaulted and free memory, the page table, the
// staging area and everything else stays in). The GPU driver's memory in
// the kernel is in no process's set and not here.
func (s SelfMemory) Own() int64 {
	var pss int64
	for _, p := range s.Processes {
		pss += p.PSS
	}
	return pss - s.MemUsed
}

// NetSaved is what the device saves its user: what the stored pages
// would take, less the store's memory and gzramd's own.
func (s SelfMemory) NetSaved() int64 { return s.Saved - s.MemUsed - s.Own() }

// Self exports gzramd's own memory by process and kind, and the net
// saving. It implements prometheus.Collector.
type Self struct {
	read               func() (SelfMemory, error)
	log                *slog.Logger
	memory, own, saved *prometheus.Desc
}

// NewSelf returns a collector over what read returns at each scrape;
// errors go to log.
func NewSelf(read func() (SelfMemory, error), log *slog.Logger) *Self {
	return &Self{
		read: read, log: log,
		memory: prometheus.NewDesc("gzramd_self_memory_bytes",
			"Memory of gzramd's own processes, by role (supervisor, serving, standby) and kind: rss (resident), pss (its share of the resident pages: a page shared by n processes counts 1/n; summed over the roles, each page once), anon, locked, pinned (by drivers, for DMA). The serving process's includes the store.",
			[]string{"role", "kind"}, nil),
		own: prometheus.NewDesc("gzramd_own_memory_bytes",
			"gzramd's own memory: its processes' pss summed, less the store's memory in use (gzramd_mem_used_bytes). The GPU driver's memory in the kernel is not in it.", nil, nil),
		saved: prometheus.NewDesc("gzramd_net_saved_bytes",
			"Memory the device saves its user net of gzramd's own: what the stored pages would take (gzramd_orig_data_bytes and 4 KiB a same-filled page) less gzramd_mem_used_bytes and gzramd_own_memory_bytes. Negative while gzramd costs more than it saves.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Self) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.memory
	ch <- m.own
	ch <- m.saved
}

// Collect implements prometheus.Collector.
func (m *Self) Collect(ch chan<- prometheus.Metric) {
	s, err := m.read()
	if err != nil {
		m.log.Warn("metrics: reading gzramd's own memory", "err", err)
		return
	}
	for _, p := range s.Processes {
		for _, k := range []struct {
			kind string
			v    int64
		}{{"rss", p.RSS}, {"pss", p.PSS}, {"anon", p.Anon}, {"locked", p.Locked}, {"pinned", p.Pinned}} {
			ch <- prometheus.MustNewConstMetric(m.memory, prometheus.GaugeValue, float64(k.v), p.Role, k.kind)
		}
	}
	ch <- prometheus.MustNewConstMetric(m.own, prometheus.GaugeValue, float64(s.Own()))
	ch <- prometheus.MustNewConstMetric(m.saved, prometheus.GaugeValue, float64(s.NetSaved()))
}
