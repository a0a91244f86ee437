// ublk requests by operation: counts, bytes, errors, latency.

package metrics

import (
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/ublk"
)

// ublkOps are the ublk operations counted by name, in the driver's
// order; any other counts as "unknown".
var ublkOps = [...]ublk.Op{
	ublk.OpRead, ublk.OpWrite, ublk.OpFlush, ublk.OpDiscard, ublk.OpWriteSame, ublk.OpWriteZeroes,
}

// Ublk counts the requests the ublk device's queues serve, by operation,
// as NBD counts NBD's: it implements ublk.Observer without locks or
// allocation, and prometheus.Collector. Its families are
// gzramd_ublk_requests_total and the rest, with the command label
// read, write, flush, discard, write_same or write_zeroes.
type Ublk struct{ r requests }

// NewUblk returns a ublk observer with every counter at zero.
func NewUblk() *Ublk {
	return &Ublk{r: newRequests("gzramd_ublk", labels(ublkOps[:]), requestsHelp{
		requests: "ublk requests served, by command.",
		bytes:    "Bytes of served ublk requests, by command.",
		errors:   "ublk requests answered with an error, by command and error code.",
		latency:  "Time from a ublk request's descriptor being read to its result being ready.",
	})}
}

// RequestDone implements ublk.Observer.
func (m *Ublk) RequestDone(op ublk.Op, length uint64, d time.Duration, errno syscall.Errno) {
	m.r.done(int(op), length, d, errno)
}

// Describe implements prometheus.Collector.
func (m *Ublk) Describe(ch chan<- *prometheus.Desc) { m.r.describe(ch) }

// Collect implements prometheus.Collector.
func (m *Ublk) Collect(ch chan<- prometheus.Metric) { m.r.collect(ch) }
