// Open NBD connections by client.

package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// MaxClientLabels bounds the TLS client names that get a label value of
// their own in gzramd_nbd_connections: the first this many names seen
// keep theirs for the process's life, and later ones count as "other",
// so that clients cannot grow the series without bound.
const MaxClientLabels = 16

// The label values that are not a client's name. A client whose
// certificate names it so counts as "other": it must not pass for the
// kernel.
const (
	KernelClient = "kernel"
	OtherClient  = "other"
)

// Connections exports the open NBD connections by client, read at
// scrape time: "kernel" for the kernel device's own, the TLS client
// certificate's name (the first MaxClientLabels seen), "other" for the
// rest. It implements prometheus.Collector.
type Connections struct {
	conns func() []nbd.ConnInfo
	desc  *prometheus.Desc

	mu    sync.Mutex
	names map[string]bool // client names with a label value of their own
	order []string
}

// NewConnections returns a collector over the connections conns returns
// (nbd.Server.Connections).
func NewConnections(conns func() []nbd.ConnInfo) *Connections {
	return &Connections{
		conns: conns,
		desc: prometheus.NewDesc("gzramd_nbd_connections",
			`Open NBD connections by client: "kernel" (the kernel device's own), a TLS client's certificate name (the first 16 names seen), "other".`,
			[]string{"client"}, nil),
		names: make(map[string]bool),
	}
}

// Label returns the client label value of c, giving its TLS client name
// a value of its own while fewer than MaxClientLabels have one.
func (m *Connections) Label(c nbd.ConnInfo) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.label(c)
}

func (m *Connections) label(c nbd.ConnInfo) string {
	switch {
	case c.Own:
		return KernelClient
	case c.Client == "" || c.Client == KernelClient || c.Client == OtherClient:
		return OtherClient
	case m.names[c.Client]:
		return c.Client
	case len(m.order) < MaxClientLabels:
		m.names[c.Client] = true
		m.order = append(m.order, c.Client)
		return c.Client
	}
	return OtherClient
}

// Describe implements prometheus.Collector.
func (m *Connections) Describe(ch chan<- *prometheus.Desc) { ch <- m.desc }

// Collect implements prometheus.Collector. "kernel", "other" and every
// client name that got a label value are always present, at 0 when none
// is open, so that a client's series does not vanish between its
// connections.
func (m *Connections) Collect(ch chan<- prometheus.Metric) {
	conns := m.conns()
	m.mu.Lock()
	counts := map[string]int{KernelClient: 0, OtherClient: 0}
	for _, c := range conns {
		counts[m.label(c)]++
	}
	for _, n := range m.order {
		counts[n] += 0
	}
	m.mu.Unlock()
	for client, n := range counts {
		ch <- prometheus.MustNewConstMetric(m.desc, prometheus.GaugeValue, float64(n), client)
	}
}
