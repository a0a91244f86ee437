// An allocation-free histogram for the request path.

package metrics

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// histogram is a lock-free, allocation-free histogram over integer
// observations (nanoseconds, pages). The request path only adds to atomic
// counters; the cumulative buckets Prometheus wants are built at scrape time.
type histogram struct {
	bounds []int64         // upper bounds, ascending, shared between histograms
	counts []atomic.Uint64 // len(bounds)+1: the last counts values above every bound
	sum    atomic.Int64
}

func newHistogram(bounds []int64) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Uint64, len(bounds)+1)}
}

func (h *histogram) observe(v int64) {
	i := 0
	for i < len(h.bounds) && v > h.bounds[i] {
		i++
	}
	h.counts[i].Add(1)
	h.sum.Add(v)
}

// metric returns a snapshot as a constant Prometheus histogram, with
// observations and bounds multiplied by scale (1e-9 turns nanoseconds into
// seconds). The count is the sum of the buckets read, so the snapshot is
// self-consistent even while observations race with the scrape.
func (h *histogram) metric(desc *prometheus.Desc, scale float64, labels ...string) prometheus.Metric {
	buckets := make(map[float64]uint64, len(h.bounds))
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i].Load()
		buckets[float64(b)*scale] = cum
	}
	cum += h.counts[len(h.bounds)].Load()
	return prometheus.MustNewConstHistogram(desc, cum, float64(h.sum.Load())*scale, buckets, labels...)
}

// count is the number of observations so far.
func (h *histogram) count() uint64 {
	var n uint64
	for i := range h.counts {
		n += h.counts[i].Load()
	}
	return n
}

// Bucket bounds. Latencies are in nanoseconds.
var (
	requestLatencyBounds = []int64{
		10e3, 25e3, 50e3, 100e3, 250e3, 500e3,
		1e6, 2.5e6, 5e6, 10e6, 25e6, 50e6, 100e6, 250e6, 500e6,
		1e9, 2.5e9, 10e9,
	}
	batchLatencyBounds = []int64{
		25e3, 50e3, 100e3, 250e3, 500e3,
		1e6, 2.5e6, 5e6, 10e6, 25e6, 50e6, 100e6, 250e6, 1e9,
	}
	batchPagesBounds = []int64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 65536}
)
