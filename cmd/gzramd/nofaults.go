//go:build !faults

// The daemon users run: no fault injection (see faults.go).

package main

import (
	"github.com/gzramd/gzramd/pkg/device"
	"github.com/gzramd/gzramd/pkg/nbd"
)

// withFaults returns the backend to serve: the device itself.
func withFaults(dev *device.Device) nbd.Backend { return dev }
