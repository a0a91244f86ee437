// Requests by command, for either transport: counts, bytes, errors, latency.

package metrics

import (
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// errnos are the error codes counted by name: those NBD can carry
// (proto.md "Error values"); any other counts as "other".
var errnos = [...]syscall.Errno{
	syscall.EPERM, syscall.EIO, syscall.ENOMEM, syscall.EINVAL,
	syscall.ENOSPC, syscall.EOVERFLOW, syscall.ENOTSUP, syscall.ESHUTDOWN,
}

const otherErrno = len(errnos)

var errnoNames = [...]string{"EPERM", "EIO", "ENOMEM", "EINVAL", "ENOSPC", "EOVERFLOW", "ENOTSUP", "ESHUTDOWN", "other"}

func errnoIndex(e syscall.Errno) int {
	for i, x := range errnos {
		if x == e {
			return i
		}
	}
	return otherErrno
}

type commandStats struct {
	requests atomic.Uint64
	bytes    atomic.Uint64
	errors   [len(errnos) + 1]atomic.Uint64
	latency  *histogram
}

// requests counts a transport's requests by command, the last command
// being "unknown". It is the request path's: done takes no lock and
// allocates nothing.
type requests struct {
	cmds  []commandStats
	names []string // the commands' label values, "unknown" last

	requestsDesc, bytesDesc, errorsDesc, latencyDesc *prometheus.Desc
}

// labels are cmds' label values, as they name themselves.
func labels[C fmt.Stringer](cmds []C) []string {
	names := make([]string, len(cmds))
	for i, c := range cmds {
		names[i] = c.String()
	}
	return names
}

// requestsHelp is the help of a transport's four request families.
type requestsHelp struct{ requests, bytes, errors, latency string }

// newRequests makes the families prefix_requests_total,
// prefix_request_bytes_total, prefix_request_errors_total and
// prefix_request_duration_seconds.
func newRequests(prefix string, names []string, help requestsHelp) requests {
	r := requests{
		cmds:         make([]commandStats, len(names)+1),
		names:        append(names[:len(names):len(names)], "unknown"),
		requestsDesc: prometheus.NewDesc(prefix+"_requests_total", help.requests, []string{"command"}, nil),
		bytesDesc:    prometheus.NewDesc(prefix+"_request_bytes_total", help.bytes, []string{"command"}, nil),
		errorsDesc:   prometheus.NewDesc(prefix+"_request_errors_total", help.errors, []string{"command", "error"}, nil),
		latencyDesc:  prometheus.NewDesc(prefix+"_request_duration_seconds", help.latency, []string{"command"}, nil),
	}
	for i := range r.cmds {
		r.cmds[i].latency = newHistogram(requestLatencyBounds)
	}
	return r
}

// done counts a request of command i (len(names) or more: unknown).
func (r *requests) done(i int, length uint64, d time.Duration, errno syscall.Errno) {
	s := &r.cmds[min(i, len(r.cmds)-1)]
	s.requests.Add(1)
	s.bytes.Add(length)
	if errno != 0 {
		s.errors[errnoIndex(errno)].Add(1)
	}
	s.latency.observe(int64(d))
}

func (r *requests) describe(ch chan<- *prometheus.Desc) {
	ch <- r.requestsDesc
	ch <- r.bytesDesc
	ch <- r.errorsDesc
	ch <- r.latencyDesc
}

// collect sends every command's request counter (so that rates start
// from zero), but unknown's until one came; error series appear once an
// error of that kind happened.
func (r *requests) collect(ch chan<- prometheus.Metric) {
	for i := range r.cmds {
		s := &r.cmds[i]
		name := r.names[i]
		n := s.requests.Load()
		if i == len(r.cmds)-1 && n == 0 {
			continue
		}
		ch <- prometheus.MustNewConstMetric(r.requestsDesc, prometheus.CounterValue, float64(n), name)
		ch <- prometheus.MustNewConstMetric(r.bytesDesc, prometheus.CounterValue, float64(s.bytes.Load()), name)
		for e := range s.errors {
			if v := s.errors[e].Load(); v != 0 {
				ch <- prometheus.MustNewConstMetric(r.errorsDesc, prometheus.CounterValue, float64(v), name, errnoNames[e])
			}
		}
		ch <- s.latency.metric(r.latencyDesc, 1e-9, name)
	}
}
