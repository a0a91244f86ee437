// NBD requests by command: counts, bytes, errors, latency.

package metrics

import (
	"sync/atomic"
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

const unknownCommand = len(commands)

// errnos are the error codes NBD can carry (proto.md "Error values").
var errnos = [...]syscall.Errno{
	syscall.EPERM, syscall.EIO, syscall.ENOMEM, syscall.EINVAL,
	syscall.ENOSPC, syscall.EOVERFLOW, syscall.ENOTSUP, syscall.ESHUTDOWN,
}

const otherErrno = len(errnos)

var errnoNames = [...]string{"EPERM", "EIO", "ENOMEM", "EINVAL", "ENOSPC", "EOVERFLOW", "ENOTSUP", "ESHUTDOWN", "other"}

type commandStats struct {
	requests atomic.Uint64
	bytes    atomic.Uint64
	errors   [len(errnos) + 1]atomic.Uint64
	latency  *histogram
}

// NBD counts NBD requests by command: requests, bytes, errors by code and
// a latency histogram. It implements nbd.Observer without locks or
// allocation, and prometheus.Collector.
type NBD struct {
	cmds [len(commands) + 1]commandStats

	requestsDesc, bytesDesc, errorsDesc, latencyDesc *prometheus.Desc
}

// NewNBD returns an NBD observer with every counter at zero.
func NewNBD() *NBD {
	m := &NBD{
		requestsDesc: prometheus.NewDesc("gzramd_nbd_requests_total",
			"NBD requests completed, by command.", []string{"command"}, nil),
		bytesDesc: prometheus.NewDesc("gzramd_nbd_request_bytes_total",
			"Bytes named by the length field of completed NBD requests, by command.", []string{"command"}, nil),
		errorsDesc: prometheus.NewDesc("gzramd_nbd_request_errors_total",
			"NBD requests answered with an error, by command and error code.", []string{"command", "error"}, nil),
		latencyDesc: prometheus.NewDesc("gzramd_nbd_request_duration_seconds",
			"Time from an NBD request's header being read to its reply being written.", []string{"command"}, nil),
	}
	for i := range m.cmds {
		m.cmds[i].latency = newHistogram(requestLatencyBounds)
	}
	return m
}

func commandIndex(c nbd.Command) int {
	if int(c) < len(commands) {
		return int(c)
	}
	return unknownCommand
}

func commandName(i int) string {
	if i < len(commands) {
		return commands[i].String()
	}
	return "unknown"
}

func errnoIndex(e uint32) int {
	for i, x := range errnos {
		if uint32(x) == e {
			return i
		}
	}
	return otherErrno
}

// RequestDone implements nbd.Observer.
func (m *NBD) RequestDone(cmd nbd.Command, length uint32, d time.Duration, errno uint32) {
	s := &m.cmds[commandIndex(cmd)]
	s.requests.Add(1)
	s.bytes.Add(uint64(length))
	if errno != 0 {
		s.errors[errnoIndex(errno)].Add(1)
	}
	s.latency.observe(int64(d))
}

// Requests returns the number of completed requests of cmd.
func (m *NBD) Requests(cmd nbd.Command) uint64 { return m.cmds[commandIndex(cmd)].requests.Load() }

// Describe implements prometheus.Collector.
func (m *NBD) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.requestsDesc
	ch <- m.bytesDesc
	ch <- m.errorsDesc
	ch <- m.latencyDesc
}

// Collect implements prometheus.Collector. Every command's request
// counter is always present (so rates start from zero); error series
// appear once an error of that kind happened.
func (m *NBD) Collect(ch chan<- prometheus.Metric) {
	for i := range m.cmds {
		s := &m.cmds[i]
		name := commandName(i)
		n := s.requests.Load()
		if i == unknownCommand && n == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.requestsDesc, prometheus.CounterValue, float64(n), name)
		ch <- prometheus.MustNewConstMetric(m.bytesDesc, prometheus.CounterValue, float64(s.bytes.Load()), name)
		for e := range s.errors {
			if v := s.errors[e].Load(); v != 0 {
				ch <- prometheus.MustNewConstMetric(m.errorsDesc, prometheus.CounterValue, float64(v), name, errnoNames[e])
			}
		}
		ch <- s.latency.metric(m.latencyDesc, 1e-9, name)
	}
}
