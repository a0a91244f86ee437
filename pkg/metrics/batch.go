// Histograms of staged batches: pages and compression time, per backend.

package metrics

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// maxBackends bounds the backends tracked; the router has two (the GPU and
// the CPU), and names past the bound share the last entry as "other".
const maxBackends = 8

type backendStats struct {
	name    string
	pages   *histogram
	latency *histogram
}

// Batches records batch sizes and latencies per backend. It implements
// route.Observer and prometheus.Collector.
type Batches struct {
	mu       sync.Mutex // serialises adding a backend
	backends atomic.Pointer[[]*backendStats]

	pagesDesc, latencyDesc *prometheus.Desc
}

// NewBatches returns an empty batch observer.
func NewBatches() *Batches {
	m := &Batches{
		pagesDesc: prometheus.NewDesc("gzramd_batch_pages",
			"Pages per compressed batch, by backend.", []string{"backend"}, nil),
		latencyDesc: prometheus.NewDesc("gzramd_batch_duration_seconds",
			"Time to compress one batch, by backend.", []string{"backend"}, nil),
	}
	m.backends.Store(&[]*backendStats{})
	return m
}

func (m *Batches) backend(name string) *backendStats {
	for _, b := range *m.backends.Load() {
		if b.name == name {
			return b
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.backends.Load()
	for _, b := range cur {
		if b.name == name {
			return b
		}
	}
	if len(cur) >= maxBackends {
		name = "other"
		for _, b := range cur {
			if b.name == name {
				return b
			}
		}
	}
	b := &backendStats{name: name, pages: newHistogram(batchPagesBounds), latency: newHistogram(batchLatencyBounds)}
	next := append(append(make([]*backendStats, 0, len(cur)+1), cur...), b)
	m.backends.Store(&next)
	return b
}

// BatchDone implements route.Observer.
func (m *Batches) BatchDone(backend string, pages int, d time.Duration) {
	b := m.backend(backend)
	b.pages.observe(int64(pages))
	b.latency.observe(int64(d))
}

// Describe implements prometheus.Collector.
func (m *Batches) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.pagesDesc
	ch <- m.latencyDesc
}

// Collect implements prometheus.Collector.
func (m *Batches) Collect(ch chan<- prometheus.Metric) {
	for _, b := range *m.backends.Load() {
		ch <- b.pages.metric(m.pagesDesc, 1, b.name)
		ch <- b.latency.metric(m.latencyDesc, 1e-9, b.name)
	}
}

// Track makes backend's series appear before its first batch, so that
// dashboards see zeroes rather than nothing.
func (m *Batches) Track(backend string) { m.backend(backend) }
