//go:build !pprof

// CPU profiling is refused in normal builds (see profile_pprof.go).

package serving

import (
	"errors"
	"os"
)

// startCPUProfile refuses GZRAMD_CPUPROFILE in normal builds; see
// profile_pprof.go for why profiling needs its own build.
func startCPUProfile() (stop func(), err error) {
	if os.Getenv("GZRAMD_CPUPROFILE") != "" {
		return nil, errors.New("GZRAMD_CPUPROFILE needs a build with -tags pprof (go build -tags pprof ./cmd/gzramd)")
	}
	return func() {}, nil
}
