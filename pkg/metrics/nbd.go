// NBD requests by command: counts, bytes, errors, latency.

package metrics

import (
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gzramd/gzramd/pkg/nbd"
)

// commands are the NBD commands counted by name; anything else counts as
// "unknown" (the server rejects those with EINVAL).
var commands = [...]nbd.Command{
	nbd.CmdRead, nbd.CmdWrite, nbd.CmdDisc, nbd.CmdFlush, nbd.CmdTrim,
	nbd.CmdCache, nbd.CmdWriteZeroes, nbd.CmdBlockStatus,
}

// NBD counts NBD requests by command: requests, bytes, errors by code and
// a latency histogram. It implements nbd.Observer without locks or
// allocation, and prometheus.Collector.
type NBD struct{ r requests }

// NewNBD returns an NBD observer with every counter at zero.
func NewNBD() *NBD {
	return &NBD{r: newRequests("gzramd_nbd", labels(commands[:]), requestsHelp{
		requests: "NBD requests completed, by command.",
		bytes:    "Bytes named by the length field of completed NBD requests, by command.",
		errors:   "NBD requests answered with an error, by command and error code.",
		latency:  "Time from an NBD request's header being read to its reply being written.",
	})}
}

// commandIndex is cmd's place in commands: its value, as they are in
// order.
func commandIndex(cmd nbd.Command) int { return int(min(cmd, nbd.Command(len(commands)))) }

// RequestDone implements nbd.Observer.
func (m *NBD) RequestDone(cmd nbd.Command, length uint32, d time.Duration, errno uint32) {
	m.r.done(commandIndex(cmd), uint64(length), d, syscall.Errno(errno))
}

// Requests returns the number of completed requests of cmd.
func (m *NBD) Requests(cmd nbd.Command) uint64 { return m.r.cmds[commandIndex(cmd)].requests.Load() }

// Describe implements prometheus.Collector.
func (m *NBD) Describe(ch chan<- *prometheus.Desc) { m.r.describe(ch) }

// Collect implements prometheus.Collector.
func (m *NBD) Collect(ch chan<- prometheus.Metric) { m.r.collect(ch) }
