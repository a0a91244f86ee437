// The serving process's configuration: gzramd serve's flags, one field a
// flag (cmd/gzramd binds them), and what the machine implies.

package serving

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// Config is gzramd serve's flags, a field each, named as the flag (--size
// is Size, --kernel-dead-timeout KernelDeadTimeout): their meaning is in
// the flags' help. cmd/gzramd validates them before Run.
type Config struct {
	Size          Size
	MemLimit      Size
	Prefault      Size
	Socket        string
	TCP           string
	TLSCert       string
	TLSKey        string
	TLSCA         string
	TCPInsecure   bool
	Export        string
	Metrics       string
	Backend       string
	Algorithm     string
	Staging       Size
	StagingWait   time.Duration
	BatchPages    int
	BatchDeadline time.Duration
	BatchInFlight int
	HugeThreshold int
	ObjectPages   int
	DenseAfter    time.Duration
	DenseCPU      float64
	DenseLevel    int
	LogLevel      string

	Device string
	// Transport is how the kernel device is served: "nbd" or "ublk" once
	// resolved (ResolveTransport), "auto" before.
	Transport    string
	Swap         bool
	SwapPriority int
	KernelConns  int
	// UblkDepth is how many requests each ublk queue holds at once
	// (0: ublk's default).
	UblkDepth     int
	MaxConns      int
	KernelTimeout time.Duration
	// kernelDeadTimeout: how long the kernel device holds its I/O while
	// no serving process is connected.
	KernelDeadTimeout time.Duration
	Force             bool

	GPUDevice   int
	GPUMinPages int

	Harden           bool
	Reexec           bool
	Realtime         string
	NBDInline        string
	NBDInlineHelpers int
	RequireHardening bool
	GoMemoryLimit    Size
	GCPercent        int

	RecordTrace string
	Supervise   bool
	Standby     bool

	// plan is what the daemon holds ahead of need on this machine.
	Plan swapsafe.Plan
}

// Size is a byte count; cmd/gzramd parses it from 4096, 512KiB, 8GiB.
type Size int64

// String formats a size with the largest binary unit it is a whole
// multiple of (8GiB, 512KiB), or as a plain count (4097).
func (s Size) String() string {
	n := int64(s)
	switch {
	case n >= 1<<40 && n%(1<<40) == 0:
		return fmt.Sprintf("%dTiB", n>>40)
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.FormatInt(n, 10)
}

// TCPAddr binds a bare :PORT to loopback: exposing swap over the network
// is something the operator must ask for by naming the address.
func TCPAddr(s string) string {
	if strings.HasPrefix(s, ":") {
		return "127.0.0.1" + s
	}
	return s
}
