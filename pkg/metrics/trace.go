// The trace recorder's counters.

package metrics

import "github.com/prometheus/client_golang/prometheus"

// TraceRecorder is what the trace recorder (pkg/iolog, --record-trace)
// counts.
type TraceRecorder interface {
	// Written is the number of requests written to the trace.
	Written() uint64
	// Dropped is the number of requests left out of it.
	Dropped() uint64
}

// Trace exports a TraceRecorder's counters. It implements
// prometheus.Collector.
type Trace struct {
	rec              TraceRecorder
	written, dropped *prometheus.Desc
}

// NewTrace returns a collector for rec.
func NewTrace(rec TraceRecorder) *Trace {
	return &Trace{
		rec: rec,
		written: prometheus.NewDesc("gzramd_trace_records_total",
			"NBD requests written to the --record-trace file.", nil, nil),
		dropped: prometheus.NewDesc("gzramd_trace_dropped_records_total",
			"NBD requests left out of the --record-trace file: its writer had fallen a whole ring behind, or failed.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Trace) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.written
	ch <- m.dropped
}

// Collect implements prometheus.Collector.
func (m *Trace) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(m.written, prometheus.CounterValue, float64(m.rec.Written()))
	ch <- prometheus.MustNewConstMetric(m.dropped, prometheus.CounterValue, float64(m.rec.Dropped()))
}
