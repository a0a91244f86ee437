//go:build pprof

// CPU profiling, in builds with -tags pprof only.

package serving

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// startCPUProfile writes a CPU profile of the whole run to the file named
// by GZRAMD_CPUPROFILE. It exists only in builds with -tags pprof: linking
// runtime/pprof keeps the heap profiler's sampling on, and its lazily
// touched bucket table faults in memory at moments a swap daemon must not.
func startCPUProfile() (stop func(), err error) {
	path := os.Getenv("GZRAMD_CPUPROFILE")
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("GZRAMD_CPUPROFILE: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("GZRAMD_CPUPROFILE: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
