// Takeovers: serving processes that died and the ones that took their state over.

package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Takeovers is what a serving process knows of the ones before it.
type Takeovers struct {
	// Count is how many times a serving process took the state over from
	// one that died, over the state's life.
	Count uint64
	// LastPause is how long the last takeover left the device without a
	// server: from the death to this process serving again (0 when this
	// process started with an empty state, or the death's time is unknown).
	LastPause time.Duration
}

// Takeover exports Takeovers. It implements prometheus.Collector.
type Takeover struct {
	state        func() Takeovers
	count, pause *prometheus.Desc
}

// NewTakeover returns a collector over what state returns at each scrape.
func NewTakeover(state func() Takeovers) *Takeover {
	return &Takeover{
		state: state,
		count: prometheus.NewDesc("gzramd_takeovers_total",
			"Times a serving process died and another took its state (the device's memory and the kernel device) over, over the state's life.", nil, nil),
		pause: prometheus.NewDesc("gzramd_takeover_pause_seconds",
			"How long the last takeover left the device without a server: from the death until the new serving process served again.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Takeover) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.count
	ch <- m.pause
}

// Collect implements prometheus.Collector.
func (m *Takeover) Collect(ch chan<- prometheus.Metric) {
	s := m.state()
	ch <- prometheus.MustNewConstMetric(m.count, prometheus.CounterValue, float64(s.Count))
	ch <- prometheus.MustNewConstMetric(m.pause, prometheus.GaugeValue, s.LastPause.Seconds())
}
