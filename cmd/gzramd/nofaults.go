//go:build !faults

// The daemon users run: no fault injection (see faults.go).

package main

import (
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/nbd"
	"github.com/gzramd/gzramd/pkg/swapctl"
)

// withFaults returns the backend to serve, the device itself, and the
// kernel's own swap state.
func withFaults(dev *device.Device) (nbd.Backend, swapctl.Host) { return dev, swapctl.Host{} }
