//go:build faults

// Fault injection for the command's tests and the end-to-end tests. Only a
// binary built with -tags faults reads the GZRAMD_FAULT_* variables; the
// daemon users run has none of this.

package serving

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/route/routetest"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

// standInGPU is the router's accelerator: a, or where there is none and
// GZRAMD_FAULT_STAND_IN_GPU=1, routetest's stand-in for a GPU, which
// compresses LZ4 with the CPU codec (so only with --algorithm lz4). Writes
// are then staged and received straight into staging slots by either
// transport, as with a GPU, on a machine without one: the e2e scenario
// guest-ublk-staged.
func standInGPU(a route.Accelerator) route.Accelerator {
	if a == nil && os.Getenv("GZRAMD_FAULT_STAND_IN_GPU") == "1" {
		return routetest.NewAccelerator()
	}
	return a
}

// compactPolicy is the compactor's defaults, or, with
// GZRAMD_FAULT_COMPACT_OFTEN=1, a compaction every 20 ms once 64 KiB are
// wasted: TestServingDoesNotFaultWithTheDenseTier's, so that the slabs
// compaction gives back meet the writers while they serve.
func compactPolicy() device.CompactPolicy {
	if os.Getenv("GZRAMD_FAULT_COMPACT_OFTEN") != "1" {
		return device.CompactPolicy{}
	}
	const often, waste = 20 * time.Millisecond, 64 << 10
	return device.CompactPolicy{Interval: often, MinWaste: waste, MaxOverhead: 1.001,
		DenseInterval: often, DenseWaste: waste, AfterDense: 1.001}
}

// withFaults applies the GZRAMD_FAULT_* variables: reads that corrupt
// pages (GZRAMD_FAULT_CORRUPT_READS=1), a page lost by a serving process
// that took the device over from one that died
// (GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER=1), and stand-ins for the kernel's
// swap list and block devices (GZRAMD_FAULT_PROC_SWAPS,
// GZRAMD_FAULT_SYS_BLOCK). It returns the backend to serve and where to
// read the kernel's swap state.
func withFaults(dev *device.Device, tookOver bool, log *slog.Logger) (blockdev.Backend, swapctl.Host) {
	host := swapctl.Host{ProcSwaps: os.Getenv("GZRAMD_FAULT_PROC_SWAPS"), SysBlock: os.Getenv("GZRAMD_FAULT_SYS_BLOCK")}
	switch {
	case os.Getenv("GZRAMD_FAULT_CORRUPT_READS") == "1":
		return &corruptReads{Device: dev}, host
	case os.Getenv("GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER") == "1" && tookOver:
		return &losePage{Device: dev, log: log}, host
	}
	return dev, host
}

// losePage loses the first page it reads that is not all zeroes, once:
// the read returns zeroes and the stored page is dropped, so that later
// reads of it return zeroes too, as a takeover that lost a stored page
// would. It is the survive scenario's mutant, which must fail.
type losePage struct {
	*device.Device
	log  *slog.Logger
	lost atomic.Bool
}

func (l *losePage) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := l.Device.ReadAt(ctx, p, off); err != nil || l.lost.Load() {
		return err
	}
	for i := 0; i+4096 <= len(p); i += 4096 {
		page := p[i : i+4096]
		if slices.ContainsFunc(page, func(b byte) bool { return b != 0 }) && l.lost.CompareAndSwap(false, true) {
			clear(page)
			if err := l.Device.WriteZeroes(ctx, off+int64(i), int64(len(page)), false); err != nil {
				return err
			}
			l.log.Warn("fault: lost a page after the takeover (GZRAMD_FAULT_LOSE_PAGE_ON_TAKEOVER)", "offset", off+int64(i))
			break
		}
	}
	return nil
}

// corruptReads flips a byte in every 64th page it reads back that is not
// all zeroes, so that the end-to-end tests prove they notice corruption
// (test/e2e/corrupt.sh).
type corruptReads struct {
	*device.Device
	pages atomic.Uint64
}

func (c *corruptReads) ReadAt(ctx context.Context, p []byte, off int64) error {
	if err := c.Device.ReadAt(ctx, p, off); err != nil {
		return err
	}
	for i := 0; i+4096 <= len(p); i += 4096 {
		page := p[i : i+4096]
		for _, b := range page {
			if b != 0 {
				if c.pages.Add(1)%64 == 0 {
					page[(off/4096+int64(i/4096))%4096] ^= 0x5a
				}
				break
			}
		}
	}
	return nil
}
