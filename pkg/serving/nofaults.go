//go:build !faults

// The daemon users run: no fault injection (see faults.go).

package serving

import (
	"log/slog"

	"github.com/gzramd/gzramd/pkg/blockdev"
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/route"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

// withFaults returns the backend to serve, the device itself, and the
// kernel's own swap state.
func withFaults(dev *device.Device, _ bool, _ *slog.Logger) (blockdev.Backend, swapctl.Host) {
	return dev, swapctl.Host{}
}

// compactPolicy is the compactor's defaults.
func compactPolicy() device.CompactPolicy { return device.CompactPolicy{} }

// standInGPU is the router's accelerator, a.
func standInGPU(a route.Accelerator) route.Accelerator { return a }
