package nbddev

import (
	"fmt"
	"os"
	"testing"

	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// TestMain makes the process an IO flusher when it is to serve swap
// (TestKernelSwapLive in a VM), as gzramd does: without it, the Go
// runtime starting a thread under memory pressure reclaims by swapping to
// the very device this process serves, and waits for itself.
func TestMain(m *testing.M) {
	// A server process of TestKernelSurviveLive: it inherited the IO
	// flusher flag from the test process, if that has it.
	if cfg := os.Getenv(surviveServeEnv); cfg != "" {
		os.Exit(surviveServe(cfg))
	}
	if os.Getenv("NBD_SWAP_HOG") != "" {
		if err := swapsafe.ReExecAsIOFlusher(); err != nil {
			fmt.Fprintln(os.Stderr, "PR_SET_IO_FLUSHER:", err)
		}
	}
	os.Exit(m.Run())
}
