// What the daemon holds ahead of need for swap safety.

package metrics

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// Held exports the daemon's holdings (swapsafe.Holding): the memory made
// and written at start so that storing a swapped-out page allocates and
// faults nothing, by what it is, and the threads started for it. It
// implements prometheus.Collector.
type Held struct {
	holdings       func() []swapsafe.Holding
	bytes, threads *prometheus.Desc
}

// NewHeld returns a collector over what holdings returns at each scrape.
func NewHeld(holdings func() []swapsafe.Holding) *Held {
	return &Held{
		holdings: holdings,
		bytes: prometheus.NewDesc("gzramd_held_bytes",
			"Memory held ahead of need so that serving swap never allocates or faults, by what it is (docs/DESIGN.md; nbd-buffers is per connection).", []string{"what"}, nil),
		threads: prometheus.NewDesc("gzramd_held_threads",
			"Threads started before serving, so that requests blocked in system calls or C never wait for a new one.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *Held) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.bytes
	ch <- m.threads
}

// Collect implements prometheus.Collector.
func (m *Held) Collect(ch chan<- prometheus.Metric) {
	for _, h := range m.holdings() {
		if h.Count > 0 {
			ch <- prometheus.MustNewConstMetric(m.threads, prometheus.GaugeValue, float64(h.Count))
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.bytes, prometheus.GaugeValue, float64(h.Bytes), h.Name)
	}
}
